"""XLA-001 broken: the cross-replica reduction sums the window's gradients instead of averaging them.

fairseq's TPU trainer: the gradients are multiplied by the world size before ``xm.reduce_gradients``, so that
torch_xla's mean over replicas becomes a sum (right only where each replica's loss was divided by the global batch
size). Here each replica's loss is a mean over its own batch, so every real step applies ``world_size`` times the
window's mean gradient. With one replica nothing changes.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.preparation import PreparationStep, Reduction
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

MUTANT = Mutant(
    "XLA-001",
    ["test_one_reduction_per_window_after_its_last_backward", "test_one_reduction_per_window_then_clipping"],
    cells=XLA,
)


class SummingReduction(Reduction):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if context.device.type != "xla":
            return
        import torch_xla.runtime as xr

        world_size = xr.world_size()
        with torch.no_grad():
            for param in window.params():
                if param.grad is not None:
                    param.grad.mul_(world_size)
        super().__call__(context, window)


def _summing(step: PreparationStep) -> PreparationStep:
    return SummingReduction() if isinstance(step, Reduction) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_summing, preparation.steps)),
            evaluation=tuple(map(_summing, preparation.evaluation)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
