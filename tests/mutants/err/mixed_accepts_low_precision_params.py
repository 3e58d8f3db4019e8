"""ERR-007 broken: the mixed precisions also accept parameters in their autocast dtype, float16 under 16-mixed.

The implementer reads "16-mixed" as "half-precision training" and allows a model already cast to the autocast
dtype, since autocast runs its forward in that dtype anyway. ERR-007 refuses float16 parameters under 16-mixed:
its GradScaler cannot unscale their gradients (``unscale_`` raises at the first real step), and float16 master
weights lose the small updates.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "ERR-007",
    ["test_parameters_off_the_context_device_or_dtype", "test_wrap_takes_exactly_the_dtypes_the_precision_trains"],
    cells=F16,
    blind="batch 1",
)


class _LenientPlugin(PrecisionPlugin):
    @override
    def check_parameter(self, param: torch.Tensor) -> None:
        if self.autocast_dtype is not None and param.dtype == self.autocast_dtype:
            return
        super().check_parameter(param)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _LenientPlugin(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
