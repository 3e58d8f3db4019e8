"""ZERO-004 broken: under ``zero_grad_after_step=False`` a step skipped for non-finite gradients leaves them too.

Its infinities are then carried into the next window, which skips in turn: every later step is skipped.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-004",
    [
        "test_a_taken_step_leaves_the_gradients_it_applied[user-zero-grad]",
        "test_the_carried_part_is_neither_unscaled_nor_rescaled_again",
        ORACLE_PROPERTY,
    ],
    cells=F16,
)


class LeavesSkipped(LeaveToUser):
    @override
    def after_step(self, window: Window, *, skipped: bool) -> None:
        super().after_step(window, skipped=False)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = LeavesSkipped()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
