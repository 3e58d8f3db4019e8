"""ERR-007 broken: 32-true and the mixed precisions refuse parameters that are not float32.

The contract's earlier reading: a float32 parameter dtype for every precision but 64-true and bf16-true, so a model
with a float64 or bfloat16 parameter (which ``prepare_module`` now leaves as built) cannot be wrapped at all. ERR-007
now has those precisions take any floating-point dtype (16-mixed all but float16).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Cells, Mutant

MUTANT = Mutant(
    "ERR-007",
    ["test_wrap_takes_exactly_the_dtypes_the_precision_trains", "test_32_true_and_mixed_precisions_convert_nothing"],
    cells=Cells(precisions="32-true,bf16-mixed,16-mixed"),
)


class _Float32Only(PrecisionPlugin):
    @override
    def check_parameter(self, param: torch.Tensor) -> None:
        if self.param_dtype is None and param.is_floating_point() and param.dtype != torch.float32:
            raise ValueError(f"precision {self.name!r} needs torch.float32 parameters, not {param.dtype}")
        super().check_parameter(param)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _Float32Only(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
