"""AMP-007 broken, half-fixed: the loss is divided by N for headroom; every window is taken to be N long.

Lightning's automatic loop does this: ``loss / accumulate_grad_batches`` before the scaled backward, and no
correction at the step. A full window applies its mean; one cut short by ``make_optimizer_step=True``, the epoch's
flushed last window, or one made longer by ``False`` applies its sum over N instead (ACC-001).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "AMP-007",
    ["test_windows_near_the_float16_range_follow_the_recipe[3]", "test_generated_windows_near_the_float16_range"],
    cells=F16,
)


class _EveryWindowTakenFull(WindowMean):
    """The mean only where losses were not divided by ``N`` already (the window's length is never looked at)."""

    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return context.parts.scaling.window_divisor(context.accumulate_grad_batches) == 1 and super().changes(
            context, window
        )

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if context.parts.scaling.window_divisor(context.accumulate_grad_batches) == 1:
            super().__call__(context, window)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(_EveryWindowTakenFull() if isinstance(step, WindowMean) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
