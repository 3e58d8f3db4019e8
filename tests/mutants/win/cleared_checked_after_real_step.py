"""WIN-002 broken: the gradients a window held are checked after its real step too, not only while it is open.

The note of what the window held is taken at each accumulating call, and the check runs whenever the note is not
empty: after the window's real step cleared its gradients (ZERO-001), the next window's first call finds the held
parameters without a gradient and refuses, as if ``model.zero_grad()`` had cleared them. A loop that accumulates
windows of 4 stops at the fifth batch with an error it did nothing to cause.

Plausible: "a parameter of the window that had a gradient when the last call returned, and has none now" read
without its condition, "an open window", and the note kept until it is overwritten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "WIN-002",
    [
        "test_gradients_cleared_from_outside_are_refused",
        "test_what_the_wrappers_do_is_not_taken_for_a_clearing",
    ],
)


class CheckedWheneverNoted(OutsideChanges):
    @override
    def check_call(self, context: TrainingContext, window: Window) -> None:
        super().check_call(context, window)
        if not window.length:
            self.check_cleared(window)  # the defect: a closed window's note is still checked


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = CheckedWheneverNoted()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-002: a closed window's held gradients are checked after its real step")
