"""AMP-007 broken: under 16-mixed a window longer than ``accumulate_grad_batches`` is applied as its sum over ``N``.

The framework divides each loss by ``N`` in backward, as the recipe does, and then rescales the windows it expects
to be short: one cut short by ``make_optimizer_step=True`` or flushed at the epoch's last batch gets ``N / k``. It
assumed the schedule never lets a window run past ``N`` micro-steps and clamps the length to ``N``; a window that
``make_optimizer_step=False`` kept open longer applies ``k / N`` times its mean.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "AMP-007",
    ["test_windows_near_the_float16_range_follow_the_recipe[2]", "test_generated_windows_near_the_float16_range"],
    cells=F16,
    blind="contract 2026.12.5",
)


class _ClampedWindowMean(WindowMean):
    @staticmethod
    def _length(context: TrainingContext, window: Window) -> int:
        divisor = context.parts.scaling.window_divisor(context.accumulate_grad_batches)
        length = window.length + 1
        if divisor > 1:
            length = min(length, divisor)  # "a window closes at N micro-steps at the latest"
        return length

    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return self._length(context, window) != context.parts.scaling.window_divisor(context.accumulate_grad_batches)

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        normalise_window(
            window.params(),
            self._length(context, window),
            divided_by=context.parts.scaling.window_divisor(context.accumulate_grad_batches),
        )


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(_ClampedWindowMean() if isinstance(step, WindowMean) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
