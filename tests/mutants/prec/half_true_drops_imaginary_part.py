"""PREC-002 broken: bf16-true and 16-true cast a module holding complex tensors, discarding their imaginary part.

The implementer calls ``module.to(dtype)`` as Lightning's half-precision plugin does and stops there: a complex
parameter or buffer silently becomes real (torch only warns). PREC-002 refuses such a module before anything
changes, naming the tensor.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Cells, Mutant

MUTANT = Mutant(
    "PREC-002",
    ["test_half_true_refuses_complex_tensors_before_anything_changes"],
    cells=Cells(precisions="bf16-true,16-true"),
)


class _Unchecked(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.param_dtype in (torch.bfloat16, torch.float16):
            return module.to(self.param_dtype)
        return super().convert_module(module)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _Unchecked(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
