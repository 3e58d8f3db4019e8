"""CLIP-002 broken: ``unscale_gradients()`` divides the window by the micro-steps taken so far, not the closing one.

The window's length is counted in ``step()`` calls; ``unscale_gradients()`` between the window's last backward and
its closing ``step()`` divides by the calls made before it, leaving the closing micro-step out of the count: a
window of three applies 1.5 times its mean. A window of one (no earlier call) is its own mean and looks right.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import PreparationStep, WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "CLIP-002", ["test_unscale_gradients_over_windows", "test_unscale_gradients_divides_by_the_full_window"]
)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        assert isinstance(context, Context)
        context.unscaling = True
        try:
            super().unscale_gradients()
        finally:
            context.unscaling = False


class MeanExcludesClosingStepWhenUnscaling(WindowMean):
    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return True

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if not (isinstance(context, Context) and context.unscaling):
            super().__call__(context, window)
        else:
            normalise_window(window.params(), max(window.length, 1))  # the closing micro-step not counted


def _excludes_closing_step(step: PreparationStep) -> PreparationStep:
    return MeanExcludesClosingStepWhenUnscaling() if isinstance(step, WindowMean) else step


class Context(MutantContext):
    unscaling = False
    """``True`` while ``unscale_gradients()`` prepares a window (its steps: mean, reduction, unscale, clip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_excludes_closing_step, preparation.steps)), evaluation=preparation.evaluation
        )

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
