"""ZERO-007 broken: a discarded window keeps its carried part, which the next window then applies.

``on_failure="discard"`` empties the window's gradients and length but not what it carried from the last step.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FAULT_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_failed_window_discards_or_restores_its_carried_part[first micro-step-discard]",
        "test_a_failed_window_discards_or_restores_its_carried_part[later micro-step-discard]",
        "test_a_failed_window_discards_or_restores_its_carried_part[inner step-discard]",
        f"{FAULT_PROPERTY}[discard]",
    ],
)


class DropKeepsCarried(LeaveToUser):
    @override
    def drop(self, window: Window) -> None:
        window.left = None


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = DropKeepsCarried()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
