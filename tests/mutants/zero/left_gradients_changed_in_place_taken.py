"""ZERO-006 broken: gradients the last step left and the user changed in place are taken as the carried part.

``loss.backward()`` before ``step()``, or an in-place ``zero_grad(set_to_none=False)``, is not refused: the window
carries whatever the gradients became, counted once as carried and never as a micro-step.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-006",
    [
        "test_gradients_changed_in_place_before_they_were_taken_are_refused",
        "test_a_gradient_written_after_the_left_one_was_cleared_is_the_windows_own[model.zero_grad(False)]",
    ],
)


class TakesChanged(LeaveToUser):
    @override
    def check_take(self, window: Window) -> None:
        pass


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = TakesChanged()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
