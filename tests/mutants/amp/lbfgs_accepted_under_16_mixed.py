"""AMP-005 broken: LBFGS is accepted under 16-mixed.

LBFGS evaluates its closure several times inside its own ``step``, out of reach of the loss scaler's
unscale/skip/update cycle; the framework wraps it anyway and runs it on scaled gradients.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.amp import NoLossScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("AMP-005", ["test_lbfgs_is_refused_under_16_mixed"], cells=F16)

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        scaling, self.parts.scaling = self.parts.scaling, NoLossScaling()
        try:
            return super().wrap(optimizer)
        finally:
            self.parts.scaling = scaling


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
