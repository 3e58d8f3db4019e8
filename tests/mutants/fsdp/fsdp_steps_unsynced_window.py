"""FSDP-005 broken: a real step runs although no backward of its window synced.

As a loop whose last backward sat inside ``toggle_model(sync_grad=False)``: the shards' gradients are empty, the
step applies nothing (or only what weight decay and momentum do) and reports a step.
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

MUTANT = Mutant("FSDP-005", ["test_step_refuses_a_window_no_backward_synced"], cells=FSDP)


class StepsUnsynced(Sharded):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        return module, StepsUnsynced(parallel.modules)

    @override
    def check_synced(self, window: Window) -> None:
        return


class ReplicatedThenStepsUnsynced(Replicated):
    @override
    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        module, parallel = super().prepare(module, device)
        kind = StepsUnsynced if isinstance(parallel, Sharded) else ReplicatedThenStepsUnsynced
        return module, kind(parallel.modules)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        parallel = self.parts.parallel
        kind = StepsUnsynced if isinstance(parallel, Sharded) else ReplicatedThenStepsUnsynced
        self.parts.parallel = kind(parallel.modules)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
