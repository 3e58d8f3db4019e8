"""ACC-001 broken: the window's mean is taken over the parameters the optimizer held when it was wrapped.

The wrapper lists ``[p for g in optimizer.param_groups for p in g["params"]]`` once, at wrap time, and divides
those gradients by the window's length: a parameter group added later with ``add_param_group`` steps on the sum of
its window's gradients.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        vars(self._slots[-1])["at_wrap"] = self._slots[-1].params()
        return wrapper

    def _normalise_window(self, slot: Slot) -> None:
        if slot.pending:
            at_wrap: list[torch.Tensor] = vars(slot)["at_wrap"]
            normalise_window(at_wrap, slot.pending + 1)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
