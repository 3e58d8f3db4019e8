"""ACC-001 broken: a real step applies the sum of the window's gradients, not their mean.

The accumulated ``.grad`` is handed to the inner optimizer as it is, with no normalisation at all.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ACC-001",
    [
        "test_window_equals_concatenated_batch",
        "test_window_cut_short_applies_its_own_mean",
        "test_schedule_flushes_last_partial_window",
        "test_gan_cadences",
        ORACLE_PROPERTY,
    ],
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(step for step in preparation.steps if not isinstance(step, WindowMean)),
            evaluation=preparation.evaluation,
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
