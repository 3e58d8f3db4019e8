"""FAIL-003 broken: a discarded window's optimizer keeps what the loss scaler recorded of it in the iteration.

A framework that drops the gradients of a failed call and forgets that ``unscale_gradients()`` (or the failed real
step) had already unscaled the optimizer: torch's ``GradScaler`` then refuses to unscale the next window in the same
iteration, or carries a found-inf the next window never had.
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
    "FAIL-003",
    [
        "test_a_failed_window_leaves_no_found_inf_behind[discard-closure]",
        "test_a_failed_window_leaves_no_found_inf_behind[discard-inner-step]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[hook-flushed]",
    ],
    cells=F16,
)


class _KeepsRecords(GradScaling):
    @override
    def forget(self, optimizer: torch.optim.Optimizer) -> None:
        """Nothing is forgotten."""


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scaler = self.parts.scaling.scaler
        if scaler is not None:
            self.parts.scaling = _KeepsRecords(scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
