"""CLOS-003 broken under FSDP: a failed call restores the shards' gradients but not FSDP's unsynced sums.

As an implementation whose window is ``param.grad`` only (it still refuses a step no backward synced): a closure
that raises after its backward leaves that backward's gradient in FSDP's accumulation on the unsharded parameters,
and the retried call adds it again. (The data parallelism's window is the parameters alone: the failure policy's
transaction never sees the unsynced sums.)
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.parallel import DataParallel, Replicated, Sharded
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, Mutant

MUTANT = Mutant(
    "CLOS-003",
    [
        "test_sharded_windows_match_one_process[2-modules-raising-closures-restore]",
        "test_sharded_windows_match_one_process[2-modules-raising-accumulating-toggle-restore]",
        "test_sharded_windows_match_one_process[user-sharded-blocks-restore]",
    ],
    cells=FSDP,
)


class ShardsOnly(Sharded):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        return module, ShardsOnly(parallel.modules)

    @override
    def window_tensors(self, window: Window) -> list[torch.Tensor]:
        return window.params()

    @override
    def clear_unsynced(self, window: Window) -> None:
        return


class ReplicatedThenShardsOnly(Replicated):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        kind = ShardsOnly if isinstance(parallel, Sharded) else ReplicatedThenShardsOnly
        return module, kind(parallel.modules)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parallel = self.parts.parallel
        kind = ShardsOnly if isinstance(parallel, Sharded) else ReplicatedThenShardsOnly
        self.parts.parallel = kind(parallel.modules)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
