"""ERR-007 broken: ``wrap`` checks only the parameters of the optimizer's first parameter group.

The device and dtype are checked on ``optimizer.param_groups[0]``, as code that infers "the optimizer's device" from
its first group does: a second group with a float64 or CPU parameter is accepted.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    _checked: set[int] | None = None

    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        groups = getattr(optimizer, "param_groups", None)
        self._checked = {id(p) for p in groups[0]["params"]} if isinstance(groups, list) and groups else None
        try:
            return super().wrap(optimizer)
        finally:
            self._checked = None

    def _check_parameter(self, param: torch.Tensor) -> None:
        if self._checked is None or id(param) in self._checked:
            super()._check_parameter(param)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
