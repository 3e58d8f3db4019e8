"""PREC-001 broken: 64-true's ``prepare_module`` casts every buffer to float64, integer ones included.

The implementer writes the cast as a loop over ``module.parameters()`` and ``module.buffers()`` (``t.data =
t.data.to(dtype)``) instead of ``module.double()``, which skips non-floating tensors. BatchNorm's
``num_batches_tracked`` then becomes a float tensor; the model still trains, but its state dict changes dtype
(and a complex tensor loses its imaginary part on the way).
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

MUTANT = Mutant(
    "PREC-001",
    ["test_prepare_module_casts_floating_buffers_only", "test_64_true_casts_floating_tensors_as_double_does"],
    cells=F64,
    blind="batch 1",
)


class _CastEverything(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.param_dtype is None:  # 32-true and the mixed precisions cast nothing
            return module
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.data = tensor.data.to(self.param_dtype)
        return module


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _CastEverything(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
