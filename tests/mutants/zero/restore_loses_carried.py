"""ZERO-007 broken: a failed call that keeps its window does not put back the gradients it took from the last step.

Under ``on_failure="restore"`` (and for a call that fails before any backward) the window is as before, except that
what the last step left is gone: the retried window carries nothing.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser, Taking
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FAULT_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_failed_window_discards_or_restores_its_carried_part[first micro-step-restore]",
        "test_a_failed_window_discards_or_restores_its_carried_part[before any backward-discard]",
        "test_a_failed_window_discards_or_restores_its_carried_part[before any backward-restore]",
        FAULT_PROPERTY,
    ],
)


class LosesTaken(LeaveToUser):
    @override
    def untake(self, window: Window, taking: Taking) -> None:
        window.left = None
        window.carried = taking.carried


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = LosesTaken()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
