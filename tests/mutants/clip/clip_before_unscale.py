"""CLIP-001 broken: configured clipping is applied to the scaled gradients, before unscaling.

Lightning before 1.2 clipped in the training loop before the precision plugin unscaled: under 16-mixed the clip
threshold meets gradients ``scale`` times too large, so the step applies a uselessly small update.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import Clipping, Preparation, Reduction, Unscaling, WindowMean
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("CLIP-001", ["test_configured_clipping"], cells=F16)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        clipping = [step for step in preparation.steps if isinstance(step, Clipping)]
        # The configured clipping moved in front of the loss scaler's unscaling.
        self.parts.preparation = Preparation(
            steps=(WindowMean(), Reduction(), *clipping, Unscaling()), evaluation=preparation.evaluation
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
