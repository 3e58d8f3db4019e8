"""ERR-007 broken: 16-true also takes float32 parameters (float32 "master" copies beside the float16 model).

The implementer allows float32 parameters in 16-true so that a user can keep a sensitive layer in float32 next to
the float16 ones; their optimizer state is then float32 and the precision no longer says what the model trains in.
ERR-007: 16-true trains float16 parameters only.
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


class _Lenient(PrecisionPlugin):
    @override
    def check_parameter(self, param: torch.Tensor) -> None:
        if self.name == "16-true" and param.dtype == torch.float32:
            return
        super().check_parameter(param)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _Lenient(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
