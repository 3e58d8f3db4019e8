"""PREC-002 broken: bf16-true and 16-true refuse a complex tensor only when the cast reaches it.

The implementer casts tensor by tensor (``module._apply``, as ``module.to`` does) and raises on the first complex
one: the refusal names it, but every tensor cast before it (submodules come first) stays cast. PREC-002 refuses the
module before anything changes.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16_TRUE, Mutant

MUTANT = Mutant("PREC-002", ["test_half_true_refuses_complex_tensors_before_anything_changes"], cells=F16_TRUE)


class _Midway(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        dtype = self.param_dtype
        if dtype not in (torch.bfloat16, torch.float16):
            return super().convert_module(module)
        names = {id(t): name for name, t in [*module.named_parameters(), *module.named_buffers()]}

        def cast(tensor: torch.Tensor) -> torch.Tensor:
            if tensor.is_complex():
                raise ValueError(f"precision {self.name!r} cannot cast the complex tensor {names.get(id(tensor))!r}")
            return tensor.to(dtype) if tensor.is_floating_point() else tensor

        cast_module: torch.nn.Module = module._apply(cast)
        return cast_module


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _Midway(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
