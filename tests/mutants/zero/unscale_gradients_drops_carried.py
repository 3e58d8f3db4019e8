"""ZERO-005 broken (with CLIP-002): ``unscale_gradients()`` prepares the window without its carried part, which is lost.

Reasoning: ``unscale_gradients()`` is there to unscale (and let the user clip) the window's *own* scaled gradients;
the carried part is unscaled already, so the early preparation leaves it out "to be added at the step". But the
closing step does not prepare a prepared window again (AMP-002, CLIP-002), so the carried part is never added, and
the step clears it. The amended ZERO-005: ``unscale_gradients()`` takes the carried part, and "makes the gradients that
sum (CLIP-002)". Only a loop that calls ``unscale_gradients()`` (manual clipping, Lightning's
``on_before_optimizer_step`` gradient logging) meets it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import AddCarried, Preparation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ZERO-005", ["test_unscale_gradients_makes_the_sum_the_user_clips[backward]"], blind="batch 3")


class _EarlyWithoutCarried(Preparation):
    @override
    def prepare(self, context: TrainingContext, window: Window) -> None:
        call = context.windows.call
        early = call is None or call.window is not window  # unscale_gradients(), not the closing step() call
        for step in self.steps:
            if early and isinstance(step, AddCarried):
                continue  # unscale_gradients(): the window's own gradients only
            step(context, window)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        old = self.parts.preparation
        self.parts.preparation = _EarlyWithoutCarried(steps=old.steps, evaluation=old.evaluation)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
