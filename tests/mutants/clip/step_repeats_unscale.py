"""CLIP-002 broken: ``unscale_gradients()`` is not remembered, and the real step repeats it.

It divides the gradients by the scale itself, unknown to the ``GradScaler``, whose ``step`` then unscales them
again; nor does it pin the window, so a following ``step()`` that does not close it accumulates silently.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Cells, Mutant

MUTANT = Mutant("CLIP-002", ["test_manual_clip_after_unscale_gradients"], cells=Cells(precisions="32-true,16-mixed"))


class Wrapper(WrappedOptimizer[Any]):
    @override
    def unscale_gradients(self) -> None:
        scaler = self.training_context.scaler
        if scaler is None:
            return
        inverse = 1.0 / scaler.get_scale()
        with torch.no_grad():
            for param in self.training_context.windows[self.window_index].params():
                if param.grad is not None:
                    param.grad.mul_(inverse)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
