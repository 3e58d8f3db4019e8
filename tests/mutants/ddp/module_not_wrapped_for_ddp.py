"""DDP-002 broken: ``prepare_module`` does not wrap the module in ``DistributedDataParallel``.

Under a process group of several ranks each rank trains alone on its shard: nothing reduces the gradients, so
the ranks drift apart and none matches the single-process result on the global batch.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.parallel import DataParallel, Replicated
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, Mutant

MUTANT = Mutant("DDP-002", ["test_closure_form_syncs_once_per_window"], cells=DDP)


class NeverWrapped(Replicated):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        return module, NeverWrapped([*self.modules, module])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if type(self.parts.parallel) is Replicated:
            self.parts.parallel = NeverWrapped(self.parts.parallel.modules)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
