"""ERR-007 broken: under 16-mixed ``wrap`` accepts float16 parameters.

The amended ERR-007 lets 32-true and the mixed precisions take "any floating-point dtype, as ``prepare_module`` leaves
it" (PREC-001: they convert nothing); the implementer checks only the ``-true`` precisions' dtype and accepts every
floating dtype elsewhere, missing the one exception: float16 under 16-mixed, whose gradients ``GradScaler`` refuses to
unscale. The user's half-cast model is accepted at ``wrap``, accumulates a window, and fails at the first real step
("Attempting to unscale FP16 gradients") with the window's micro-steps discarded. ERR-007: ``wrap`` refuses it with
``ValueError``, and ``add_param_group`` refuses it before the inner optimizer changes.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "ERR-007",
    ["test_wrap_takes_exactly_the_dtypes_the_precision_trains", "test_parameters_off_the_context_device_or_dtype"],
    cells=F16,
    blind="batch 3",
)


class _AnyFloatWhenMixed(PrecisionPlugin):
    @override
    def check_parameter(self, param: torch.Tensor) -> None:
        if self.param_dtype is None:
            return  # 32-true and the mixed precisions take any floating-point dtype (PREC-001)
        super().check_parameter(param)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _AnyFloatWhenMixed(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
