"""PREC-002 broken: bf16-true keeps float32 parameters and only autocasts the forward pass to bfloat16.

Accelerate's ``mixed_precision="bf16"`` is autocast whatever is asked for: the model and the optimizer state stay
float32, so bf16-true saves none of the memory it exists for.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_TRUE, Mutant

MUTANT = Mutant("PREC-002", ["test_half_true_keeps_model_and_state_in_its_dtype"], cells=BF16_TRUE)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.precision == "bf16-true":
            self.parts.precision = PrecisionPlugin("bf16-true", None, autocast_dtype=torch.bfloat16)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
