"""PREC-002 broken: bf16-true and 16-true refuse a complex *parameter* but convert a complex *buffer* silently.

The implementer's check walks ``module.parameters()``, what the optimizer will train ("the imaginary part of a weight
must not be lost"), and forgets that ``module.to(dtype)`` converts buffers too: a complex buffer (a precomputed
rotary-embedding table, an FFT filter) comes out real, its imaginary part gone, with only torch's ``UserWarning``.
PREC-002: ``prepare_module`` refuses a module that holds a complex parameter *or buffer* with ``ValueError`` naming
it, before anything changes.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_TRUE, Mutant

MUTANT = Mutant(
    "PREC-002",
    ["test_half_true_refuses_complex_tensors_before_anything_changes[complex buffer]"],
    cells=BF16_TRUE,
    blind="batch 3",
)


class _ParametersChecked(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        dtype = self.param_dtype
        if dtype is None or dtype is torch.float64:
            return super().convert_module(module)
        for name, param in module.named_parameters():
            if param.is_complex():
                raise ValueError(
                    f"precision {self.name!r} casts the module with module.to({dtype}), which would discard the "
                    f"imaginary part of its complex parameter {name!r} ({param.dtype})"
                )
        return module.to(dtype=dtype)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _ParametersChecked(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
