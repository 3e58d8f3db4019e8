"""PREC-002 broken: under bf16-true ``prepare_module`` keeps floating-point buffers in float32 (parameters bf16).

Keeping normalisation statistics in float32 is a common "numerically safe" choice in mixed-precision recipes
(running means accumulate many small updates), and the implementer casts only ``module.parameters()`` for
bf16-true. PREC-002 says bf16-true leaves the module as ``module.to(torch.bfloat16)`` does: buffers in bfloat16 too.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_TRUE, Mutant

MUTANT = Mutant(
    "PREC-002",
    ["test_prepare_module_casts_floating_buffers_only", "test_half_true_casts_as_module_to_does"],
    cells=BF16_TRUE,
    blind="batch 1",
)


class _ParametersOnly(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.param_dtype is not torch.bfloat16:
            return super().convert_module(module)
        with torch.no_grad():
            for param in module.parameters():
                if param.is_floating_point():
                    param.data = param.data.to(self.param_dtype)
            for buffer in module.buffers():
                if buffer.is_floating_point():
                    buffer.data = buffer.data.float()  # statistics stay in float32
        return module


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _ParametersOnly(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
