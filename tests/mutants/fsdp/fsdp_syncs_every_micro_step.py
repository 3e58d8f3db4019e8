"""FSDP-002 broken: micro-steps of sharded modules keep gradient sync on; every micro-step reduce-scatters.

As a framework that suppresses DDP's sync (``no_sync()``) and never calls FSDP2's
``set_requires_gradient_sync(False)``: the results hold, at ``accumulate_grad_batches`` times the communication.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.parallel import DataParallel, Replicated, Sharded, no_sync
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, RANK_PROPERTY, Mutant

MUTANT = Mutant(
    "FSDP-002",
    [
        "test_sharded_windows_match_one_process[1-module-sgd]",
        "test_sharded_windows_match_one_process[1-module-sgd-clipped]",
        "test_sharded_windows_match_one_process[2-modules-adamw-sgd]",
        "test_sharded_windows_match_one_process[2-modules-clipped]",
        "test_sharded_windows_match_one_process[2-modules-toggle]",
        "test_sharded_windows_match_one_process[2-modules-raising-closures-restore]",
        "test_sharded_windows_match_one_process[2-modules-raising-accumulating-toggle-restore]",
        "test_sharded_windows_match_one_process[user-sharded-blocks-restore]",
        RANK_PROPERTY,
    ],
    cells=FSDP,
)


class ShardsKeepSyncing(Sharded):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        return module, ShardsKeepSyncing(parallel.modules)

    @override
    def without_sync(self) -> AbstractContextManager[None]:
        return no_sync(self.modules)  # DDP's no_sync() only, no FSDP unit's


class ReplicatedThenShardsKeepSyncing(Replicated):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        kind = ShardsKeepSyncing if isinstance(parallel, Sharded) else ReplicatedThenShardsKeepSyncing
        return module, kind(parallel.modules)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parallel = self.parts.parallel
        kind = ShardsKeepSyncing if isinstance(parallel, Sharded) else ReplicatedThenShardsKeepSyncing
        self.parts.parallel = kind(parallel.modules)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
