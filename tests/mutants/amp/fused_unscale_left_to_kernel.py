"""AMP-002 broken: a fused optimizer's gradients are not unscaled before its step; the fused kernel unscales them.

``GradScaler.step`` hands a fused optimizer (``_step_supports_amp_scaling``) the scale, and its kernel divides the
gradients by it, so skipping ``unscale_`` for fused optimizers looks like a free optimisation: the parameters come
out right. But ``unscale_gradients()`` then leaves the window's gradients scaled (a hand-written clip, or the
configured one, meets gradients ``scale`` times too large), which the contract forbids.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import Unscaling
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "AMP-002",
    ["test_skip_with_fused_and_foreach_adam[fused-1]", "test_skip_with_fused_and_foreach_adam[fused-3]"],
    cells=F16,
)


class _FusedLeftToKernel(Unscaling):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if getattr(window.optimizer, "_step_supports_amp_scaling", False):
            return
        super().__call__(context, window)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(_FusedLeftToKernel() if isinstance(step, Unscaling) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
