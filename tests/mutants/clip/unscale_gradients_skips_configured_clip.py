"""CLIP-002 broken: ``unscale_gradients()`` does not apply the configured clipping, and the step then skips it.

Clipping is tied to the step's own unscale: when the user has already prepared the window with
``unscale_gradients()`` (to inspect or clip by hand), the step sees it prepared and goes straight to the inner
step, so ``gradient_clip_val`` silently does nothing on those steps.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.preparation import Clipping, PreparationStep
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-002", ["test_unscale_gradients_prepares_only_its_own_window"])


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


class ClippingOfTheStepOnly(Clipping):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if not (isinstance(context, Context) and context.unscaling):
            super().__call__(context, window)


def _step_only(step: PreparationStep) -> PreparationStep:
    return ClippingOfTheStepOnly(step.value, step.algorithm) if isinstance(step, Clipping) else step


class Context(MutantContext):
    unscaling = False
    """``True`` while ``unscale_gradients()`` prepares a window (its steps: mean, reduction, unscale, clip)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_step_only, preparation.steps)), evaluation=preparation.evaluation
        )

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
