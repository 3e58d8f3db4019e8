"""PREC-003 broken: bf16-mixed scales the loss with a ``GradScaler``, like 16-mixed.

One mixed-precision code path for both half types: bfloat16, which has float32's range, gets a loss scaler, so
``wrapper.backward`` leaves scaled gradients and non-finite ones skip steps.
"""

from __future__ import annotations

from typing import Any

from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant(
    "PREC-003",
    ["test_bf16_mixed_is_autocast_only", "test_bf16_mixed_windows_are_unscaled_and_never_skip"],
    cells=BF16_MIXED,
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.precision == "bf16-mixed":
            self.parts.scaling = GradScaling(GradScaler(self.device.type))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
