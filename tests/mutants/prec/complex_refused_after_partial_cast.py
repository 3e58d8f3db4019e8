"""PREC-002 broken: the complex refusal comes in the middle of the conversion, after earlier submodules were cast.

A one-pass conversion: walk the submodules, refuse the first complex tensor met, cast each submodule's own tensors
to the half dtype as it goes (``module.to`` recurses the same way). The error is raised and names the tensor, as
PREC-002 asks, but every submodule before the complex one is bfloat16/float16 already: the user who catches the error
and falls back to another precision (or to 32-true) trains a half-cast model. PREC-002: the refusal comes "before
anything changes".
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16_TRUE, Mutant

MUTANT = Mutant(
    "PREC-002",
    ["test_half_true_refuses_complex_tensors_before_anything_changes[complex buffer beside BatchNorm]"],
    cells=F16_TRUE,
    blind="batch 3",
)


class _OnePass(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        dtype = self.param_dtype
        if dtype is None or dtype is torch.float64:
            return super().convert_module(module)
        for prefix, sub in module.named_modules():
            own = [*sub.named_parameters(recurse=False), *sub.named_buffers(recurse=False)]
            for name, tensor in own:
                if tensor.is_complex():
                    raise ValueError(
                        f"precision {self.name!r} casts the module with module.to({dtype}), which would discard the "
                        f"imaginary part of its complex tensor {prefix + '.' + name if prefix else name!r}"
                    )
            with torch.no_grad():
                for _, param in sub.named_parameters(recurse=False):
                    if param.is_floating_point():
                        param.data = param.data.to(dtype)
                for key, buffer in list(sub._buffers.items()):
                    if buffer is not None and buffer.is_floating_point():
                        sub._buffers[key] = buffer.to(dtype)
        return module


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _OnePass(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
