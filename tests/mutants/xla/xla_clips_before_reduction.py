"""XLA-001 broken: the window's gradients are clipped before they are reduced across replicas.

Lightning 1.x on TPUs: the training loop clips the gradients, then ``xm.optimizer_step`` reduces them and steps. Each
replica clips its own gradient by its own norm, so the reduced gradient is not the clipped reduced gradient (with a
norm up to the threshold divided by the world size where the replicas disagree).
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import Clipping, Preparation, Reduction, Unscaling, WindowMean
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

MUTANT = Mutant("XLA-001", ["test_one_reduction_per_window_then_clipping"], cells=XLA)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        clipping = [step for step in preparation.steps if isinstance(step, Clipping)]
        # The cross-replica reduction moved after the configured clipping.
        self.parts.preparation = Preparation(
            steps=(WindowMean(), Unscaling(), *clipping, Reduction()), evaluation=preparation.evaluation
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
