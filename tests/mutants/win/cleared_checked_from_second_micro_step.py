"""WIN-002 broken: a window with one micro-step accumulated is not checked for gradients cleared from outside.

Off by one in what counts as "open": the check runs only when the window holds more than one micro-step, read as
"a window that accumulated" (one micro-step is taken for the call that is about to close it). A window of
``accumulate_grad_batches >= 3`` whose first micro-step was cleared by ``model.zero_grad()`` goes on: its length
counts the lost micro-step, and the real step divides what is left by the full length. The same holds for a wrapper's
``backward()`` outside ``step()``.

Plausible: with the usual ``accumulate_grad_batches=2`` a window of length 1 is closed by the very next call, and
"open" is often used for "in the middle of accumulating"; the spec's "An open window is one whose length is at least
1" is the last sentence of the rule.
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
        "test_gradients_cleared_from_outside_are_refused[inner optimizer zero_grad()-another wrapper's "
        "backward()-1-discard]",
        "test_gradients_cleared_from_outside_are_refused[inner optimizer zero_grad()-another wrapper's "
        "backward()-1-restore]",
        "test_gradients_cleared_from_outside_are_refused[module zero_grad()-step(closure)-1-discard]",
        "test_gradients_cleared_from_outside_are_refused[module zero_grad()-step(closure)-1-restore]",
    ],
    blind="batch 5",
)


class OpenFromTwo(OutsideChanges):
    @override
    def check_cleared(self, window: Window) -> None:
        if window.length > 1:  # the defect: a window of one micro-step is not taken for an open one
            super().check_cleared(window)

    @override
    def check_backward(self, context: TrainingContext) -> None:
        for window in context.windows.all:
            self.check_cleared(window)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = OpenFromTwo()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-002: a window of one micro-step is not checked for cleared gradients")
