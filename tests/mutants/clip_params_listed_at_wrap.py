"""CLIP-001 broken: configured clipping reaches the parameters the optimizer held when it was wrapped.

The wrapper lists the optimizer's parameters once, at wrap time, for its clipping: a parameter group added later
with ``add_param_group`` is neither counted in the norm nor clipped.
"""

from __future__ import annotations

from typing import TypeVar

import torch

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        vars(self._slots[-1])["clipped_at_wrap"] = self._slots[-1].params()
        return wrapper

    def _clip(self, slot: Slot) -> None:
        if self._clip_val is not None:
            at_wrap: list[torch.Tensor] = vars(slot)["clipped_at_wrap"]
            clip_gradients(at_wrap, self._clip_val, self._clip_algorithm)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
