"""ZERO-005 broken (16-mixed): the carried part is added to the window before the loss scaler unscales it.

The implementer keeps the carried gradients apart so that the window's mean does not divide them (right), and then
adds them back "as soon as the window is its mean", before the reduction and the unscaling, so that the rest of the
preparation sees one gradient set: one unscale, one found-inf check, one clip. Outside 16-mixed the order is
invisible; under 16-mixed the carried part, unscaled already at its own step, is divided by the loss scale again.
ZERO-005: the carried part is "not unscaled again under 16-mixed" (its Rationale names exactly this defect of plain
Lightning and torch's recipe).
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import (
    AddCarried,
    Clipping,
    Preparation,
    PreparationStep,
    Reduction,
    Unscaling,
    WindowMean,
)
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_a_taken_step_leaves_the_gradients_it_applied[user-zero-grad]",
        "test_a_window_carries_on_every_device",
        "test_a_window_applies_what_it_carries_plus_its_own_mean[windows 1, 1, 1, 1]",
    ],
    cells=F16,
    blind="batch 3",
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        old = self.parts.preparation
        clipping = tuple(step for step in old.steps if isinstance(step, Clipping))
        steps: tuple[PreparationStep, ...] = (WindowMean(), AddCarried(), Reduction(), Unscaling(), *clipping)
        self.parts.preparation = Preparation(steps=steps, evaluation=old.evaluation)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
