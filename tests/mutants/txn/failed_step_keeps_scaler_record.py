"""TXN-001 broken: a real step whose inner step raises puts the gradients back, but not the loss scaler's record.

The scaler still holds that it unscaled the optimizer in this iteration, so the retry skips the unscaling and the
inner step applies gradients that are still multiplied by the loss scale. (Under ``on_failure="restore"``, where a
failed call's window is put back, the loss scaling never forgets what it recorded of the call.)
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "TXN-001",
    [
        "test_failed_inner_step_leaves_the_window[restore-window-1-closure]",
        "test_failed_inner_step_leaves_the_window[restore-cut-short-backward-adam]",
        "test_failed_inner_step_leaves_the_window[restore-retried-in-next-batch]",
    ],
    cells=F16,
)


class KeepsItsRecord(GradScaling):
    @override
    def forget(self, optimizer: torch.optim.Optimizer) -> None:
        return  # the scaler's record of this call's unscale_ stays


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "restore" and isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = KeepsItsRecord(self.parts.scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
