"""AMP-001 broken: 16-mixed autocasts to float16 but never scales the loss.

A framework that only makes a ``GradScaler`` on CUDA: on the CPU, 16-mixed backpropagates the raw loss, so small
float16 gradients underflow and no overflow is ever detected.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.amp import NoLossScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("AMP-001", ["test_16_mixed_autocasts_and_scales_the_loss"], cells=F16)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.device.type != "cuda":
            self.parts.scaling = NoLossScaling()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
