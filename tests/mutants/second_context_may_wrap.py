"""ERR-010 broken: ``wrap`` checks only the context's own optimizers; another live context may wrap one again.

Two contexts then keep two windows and two loss scalers over the same gradients (each zeroes and steps them on its
own schedule).
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference import context as reference_context
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        if not isinstance(optimizer, WrappedOptimizer):
            owners: Any = reference_context._WRAPPED_BY
            owners.pop(optimizer, None)  # no registry across contexts: only this context's list is consulted
        return super().wrap(optimizer)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
