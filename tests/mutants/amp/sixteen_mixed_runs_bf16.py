"""AMP-001 broken: 16-mixed on the CPU silently runs bfloat16 autocast, with no loss scaling.

Lightning 1.x on the CPU: ``precision=16`` fell back to bfloat16 autocast (float16 was "not supported on CPU")
and no ``GradScaler`` was made; the forward pass is bfloat16, not the float16 that 16-mixed promises.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.reference.amp import NoLossScaling
from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("AMP-001", ["test_16_mixed_autocasts_and_scales_the_loss"], cells=F16)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.precision == "16-mixed" and self.device.type == "cpu":
            self.parts.precision = PrecisionPlugin("16-mixed", None, autocast_dtype=torch.bfloat16)
            self.parts.scaling = NoLossScaling()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
