"""CLIP-001 broken: configured clipping is applied to the window's summed gradients, before the mean is taken.

A framework that clips in its "before optimizer step" hook and averages the accumulated gradients afterwards (or
averages inside the optimizer's step): with a window of ``k`` micro-steps the threshold meets gradients ``k`` times
too large, so the step applies ``1/k`` of the clipped norm. Windows of one micro-step, the only ones a clipping
check without accumulation tries, are unaffected.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import Clipping, Preparation, Reduction, Unscaling, WindowMean
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "CLIP-001",
    [
        "test_configured_clipping_over_windows",
        "test_configured_clipping_spans_groups_and_spares_other_windows",
        "test_unscale_gradients_prepares_only_its_own_window",
        ORACLE_PROPERTY,
    ],
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        clipping = [step for step in preparation.steps if isinstance(step, Clipping)]
        # The window's mean taken last, after the configured clipping.
        self.parts.preparation = Preparation(
            steps=(Reduction(), Unscaling(), *clipping, WindowMean()), evaluation=preparation.evaluation
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
