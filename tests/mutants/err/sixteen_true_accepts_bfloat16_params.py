"""ERR-007 broken: 16-true takes any half-precision parameter, bfloat16 as well as float16.

The implementer checks "is it a 16-bit float" (``param.element_size() == 2``) instead of the precision's dtype: a
bfloat16 parameter then trains beside float16 ones, with another range and another rounding than the precision
names. ERR-007: 16-true trains float16 parameters only.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16_TRUE, Mutant

MUTANT = Mutant(
    "ERR-007",
    ["test_wrap_takes_exactly_the_dtypes_the_precision_trains", "test_parameters_off_the_context_device_or_dtype"],
    cells=F16_TRUE,
)


class _AnyHalf(PrecisionPlugin):
    @override
    def check_parameter(self, param: torch.Tensor) -> None:
        if self.name == "16-true" and param.is_floating_point() and param.element_size() == 2:
            return
        super().check_parameter(param)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _AnyHalf(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
