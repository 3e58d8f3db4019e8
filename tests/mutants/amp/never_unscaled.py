"""AMP-002 broken: the scaled gradients are never unscaled; the inner optimizer steps on them directly.

A loop that scales the loss but calls ``optimizer.step()`` itself instead of ``scaler.step(optimizer)``: every
real step applies gradients ``scale`` (65536) times too large, and clipping sees the scaled values.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import Unscaling
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-002", ["test_accumulation_over_four_micro_batches", "test_manual_clip_after_unscale_gradients"], cells=F16
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(step for step in preparation.steps if not isinstance(step, Unscaling))
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        window.optimizer.step(**kwargs)
        self.parts.device.after_step()
        return True if closure is None else None  # never skipped: the scaler is not asked


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
