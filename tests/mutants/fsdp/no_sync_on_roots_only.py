"""FSDP-002 broken: micro-steps that do not close a window turn off the sync of the prepared root modules only.

Like an author who calls ``set_requires_gradient_sync(False, recurse=False)`` (the per-unit helper) on each module
that the context prepared, as FSDP1's ``no_sync()`` on the root covered every nested unit: under FSDP2 each inner
unit (every ``Linear`` the policy sharded) keeps its own flag and reduce-scatters on every micro-step. The sums
still reach the shards, so results stay right; a window costs one reduce-scatter round per micro-step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from torch.distributed.fsdp import FSDPModule
from typing_extensions import override

from lightning_optimizer.reference.parallel import DataParallel, Sharded, no_sync
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, RANK_PROPERTY, Mutant

MUTANT = Mutant(
    "FSDP-002", ["test_sharded_windows_match_one_process[1-module-sgd]", RANK_PROPERTY], cells=FSDP, blind="batch 2"
)


class RootsOnly(Sharded):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        return module, RootsOnly(parallel.modules)

    @override
    def without_sync(self) -> AbstractContextManager[None]:
        return no_sync(self.modules, [module for module in self.modules if isinstance(module, FSDPModule)])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.parts.parallel) is Sharded:
            self.parts.parallel = RootsOnly(self.parts.parallel.modules)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
