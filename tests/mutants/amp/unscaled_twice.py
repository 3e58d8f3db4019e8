"""AMP-002 broken: gradients are unscaled twice, by the scaler's ``unscale_`` and again by hand.

The window is divided by the scale before clipping, as recipes written before ``GradScaler.unscale_`` did, after the
scaler unscaled it already: every real step applies gradients ``scale`` times too small.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.preparation import Unscaling
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "AMP-002", ["test_accumulation_over_four_micro_batches", "test_manual_clip_after_unscale_gradients"], cells=F16
)


class _UnscaledByHand(Unscaling):
    """The scaler's unscaling, then a division by the scale by hand."""

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        scaler = context.scaler
        super().__call__(context, window)
        if scaler is not None:
            inverse = 1.0 / scaler.get_scale()
            with torch.no_grad():
                for param in window.params():
                    if param.grad is not None:
                        param.grad.mul_(inverse)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(_UnscaledByHand() if isinstance(step, Unscaling) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
