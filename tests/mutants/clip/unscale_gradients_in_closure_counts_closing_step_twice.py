"""CLIP-002 broken: ``unscale_gradients()`` in the closing step's closure divides the window by ``k + 2``.

An implementation that counts a micro-step when its ``step()`` begins, and whose ``unscale_gradients()`` adds the
closing micro-step to the count as if it had not been counted: called between the window's last backward and a
closure-less ``step()`` it divides by ``k + 1`` (right), called inside the closing step's closure by ``k + 2``, so
a window of one applies half its gradient there. It is the off-by-one of a loop counter advanced before the closure
runs (frameworks that count the batch when the optimizer step begins): only the closure form shows it.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import PreparationStep, WindowMean
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-002", ["test_unscale_gradients_divides_by_the_full_window"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        assert isinstance(context, Context)
        context.in_closing_closure = context.windows[self.window_index].stage is WindowStage.CLOSING
        try:
            super().unscale_gradients()
        finally:
            context.in_closing_closure = False


class ClosingStepCountedTwiceInClosure(WindowMean):
    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return True

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if not (isinstance(context, Context) and context.in_closing_closure):
            super().__call__(context, window)
        else:
            normalise_window(window.params(), window.length + 2)  # the closing micro-step counted twice


def _counts_closing_step_twice(step: PreparationStep) -> PreparationStep:
    return ClosingStepCountedTwiceInClosure() if isinstance(step, WindowMean) else step


class Context(MutantContext):
    in_closing_closure = False
    """``True`` while ``unscale_gradients()`` prepares a window from the closing step's closure."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_counts_closing_step_twice, preparation.steps)), evaluation=preparation.evaluation
        )

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
