"""ZERO-005 broken: under 16-mixed the carried part is unscaled again with the window's gradients.

The carried gradients are added before the loss scaler's unscaling, as plain Lightning's 16-mixed and torch's recipe
leave them in ``.grad``: ``unscale_`` divides them, already unscaled, by the scale a second time.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_optimizer.reference.preparation import AddCarried, Unscaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_the_carried_part_is_neither_unscaled_nor_rescaled_again",
        "test_a_window_applies_what_it_carries_plus_its_own_mean",
        ORACLE_PROPERTY,
    ],
    cells=F16,
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        steps = [step for step in self.parts.preparation.steps if not isinstance(step, AddCarried)]
        at = next(i for i, step in enumerate(steps) if isinstance(step, Unscaling))
        steps.insert(at, AddCarried())  # before the unscaling
        self.parts.preparation = dataclasses.replace(self.parts.preparation, steps=tuple(steps))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
