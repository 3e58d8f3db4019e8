"""WIN-002 broken: gradients cleared from outside are found by ``step()`` but not by ``unscale_gradients()``.

The cleared-gradients check is made with ``step()``'s own argument checks, at the start of every ``step()``; the
shared outside check keeps only the parameters part (WIN-001). ``unscale_gradients()`` between calls then prepares a
window whose gradients ``model.zero_grad()`` cleared: it divides and unscales (and under 16-mixed records the
optimizer with the loss scaler) what is left, moves the window to its prepared stage, and only the closing ``step()``
raises, after the window was changed.

Plausible: ``unscale_gradients()`` is usually read as a helper of the closing step (for clipping by hand), and the
check for a window that a step would apply goes naturally with ``step()``.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "WIN-002",
    [
        "test_gradients_cleared_from_outside_are_refused[inner optimizer zero_grad()-unscale_gradients()-2-discard]",
        "test_gradients_cleared_from_outside_are_refused[inner optimizer zero_grad()-unscale_gradients()-2-restore]",
        "test_gradients_cleared_from_outside_are_refused[module zero_grad()-unscale_gradients()-3-discard]",
        "test_gradients_cleared_from_outside_are_refused[module zero_grad()-unscale_gradients()-3-restore]",
    ],
    blind="batch 5",
)


class ParametersOnly(OutsideChanges):
    @override
    def check_call(self, context: TrainingContext, window: Window) -> None:
        params = window.params()
        known = window.known
        if len(params) != len(known) or not all(map(operator.is_, params, known)):
            self.parameters_changed(context, window, params)
        # the defect: no cleared check here (unscale_gradients() between calls); step() makes it with its arguments


class StepChecksCleared(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        super().check_step(context, window, closure, make_optimizer_step, kwargs)
        if window.length:
            context.parts.outside.check_cleared(window)  # the defect: only step() looks for cleared gradients


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = ParametersOnly()
        self.parts.refusals = StepChecksCleared()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-002: unscale_gradients() does not find gradients cleared from outside")
