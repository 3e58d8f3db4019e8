"""PREC-002 broken: 16-true also opens float16 autocast around the forward pass.

The implementer reads Lightning's half-precision plugin, which runs steps with float16 as the default dtype, as
"autocast to float16": ops autocast keeps in float32 (softmax, norms, losses) then run in float16 too, and the region
casts what the user computes in float32 on purpose. PREC-002: no autocast in 16-true.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16_TRUE, Mutant

MUTANT = Mutant(
    "PREC-002",
    ["test_16_true_has_no_autocast_no_loss_scaling_and_never_skips", "test_true_precision_has_no_autocast"],
    cells=F16_TRUE,
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.precision == "16-true":
            self.parts.precision = PrecisionPlugin("16-true", torch.float16, autocast_dtype=torch.float16)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
