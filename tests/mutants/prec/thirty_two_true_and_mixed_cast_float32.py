"""PREC-001 broken: 32-true and the mixed precisions cast the module's floating-point tensors to float32.

The contract before 2026.12.9 said so (decision 1: "32-true casts to float32, the mixed precisions keep them in
float32 too"), and "32-true" reads as "float32": the implementer calls ``module.float()``, which keeps complex and
integer tensors and so looks as careful as ``module.double()`` in 64-true. The amended PREC-001: 32-true and the mixed
precisions convert nothing, as Lightning's plugins do: a float64 parameter or buffer stays float64 (a model that keeps
a float64 buffer on purpose, a float64 head). Every float32 model, which is every casual test, is unaffected.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PREC-001", ["test_32_true_and_mixed_precisions_convert_nothing"], blind="batch 3")


class _SinglePrecisionCasts(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.param_dtype is None:
            return module.float()  # "32-true" and AMP's float32 master weights
        return super().convert_module(module)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _SinglePrecisionCasts(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
