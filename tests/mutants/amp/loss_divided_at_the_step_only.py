"""AMP-007 broken: under 16-mixed each micro-step backpropagates the fully scaled loss; the step divides by k.

The reference until contract 2026.12.5: the window's mean is right, but each micro-step's scaled backward is
``accumulate_grad_batches`` times larger in float16 than the recipe's ``scaler.scale(loss / N)``, and overflows that
much sooner: windows that Lightning's loop and torch's examples apply are skipped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "AMP-007",
    [
        "test_windows_near_the_float16_range_follow_the_recipe[2]",
        "test_windows_near_the_float16_range_follow_the_recipe[4]",
        "test_generated_windows_near_the_float16_range",
    ],
    cells=F16,
)


class _MeanAtTheStep(WindowMean):
    """The window's sum of undivided losses becomes its mean at the step: divided by its length."""

    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return window.length > 0

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        normalise_window(window.params(), window.length + 1)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(_MeanAtTheStep() if isinstance(step, WindowMean) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)

    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self.parts.hooks
        with outside_autocast(self.device):
            self.parts.refusals.check_backward(self, loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            backward: Callable[..., None] = self.parts.scaling.scale(loss, 1).backward  # not loss / N
            with self.parts.scaling.backward():
                backward(*args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
