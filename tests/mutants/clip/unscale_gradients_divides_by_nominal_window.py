"""CLIP-002 broken: ``unscale_gradients()`` divides the window by ``accumulate_grad_batches``, not by its length.

Before its closing ``step()`` the implementation does not know yet how the window closes, so it assumes the
configured length: right for a full window, wrong for one cut short by ``make_optimizer_step=True`` or flushed by
the last batch of an epoch (a window of two in a schedule of three applies two thirds of its mean). It is the
``loss / accumulate_grad_batches`` normalisation that Lightning's manual-optimization examples write, which
under-weights every partial window. The real step's own normalisation (no ``unscale_gradients()``) stays right.
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
    "CLIP-002",
    [
        "test_unscale_gradients_divides_by_the_full_window[true]",
        "test_unscale_gradients_divides_by_the_full_window[last]",
        "test_unscale_gradients_over_windows",
    ],
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


class NominalMeanWhenUnscaling(WindowMean):
    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return True

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if not (isinstance(context, Context) and context.unscaling):
            super().__call__(context, window)
        else:
            normalise_window(
                window.params(), context.accumulate_grad_batches
            )  # the configured length, not the window's


def _nominal_when_unscaling(step: PreparationStep) -> PreparationStep:
    return NominalMeanWhenUnscaling() if isinstance(step, WindowMean) else step


class Context(MutantContext):
    unscaling = False
    """``True`` while ``unscale_gradients()`` prepares a window (its steps: mean, reduction, unscale, clip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_nominal_when_unscaling, preparation.steps)), evaluation=preparation.evaluation
        )

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
