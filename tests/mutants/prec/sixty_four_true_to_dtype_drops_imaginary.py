"""PREC-001 broken: 64-true casts with ``module.to(torch.float64)`` instead of ``module.double()``.

One code path for every ``-true`` precision: ``module.to(dtype)`` for bf16-true and 16-true, so ``module.to(float64)``
for 64-true too. For real tensors the two are the same; for a complex parameter or buffer ``module.to(float64)``
casts it to float64 and discards the imaginary part (with only a ``UserWarning``), where ``module.double()`` keeps it
complex. And since the half precisions' complex refusal is keyed to those precisions, 64-true refuses nothing either.
PREC-001: 64-true casts floating-point tensors "as ``module.double()`` does (complex and integer tensors keep their
dtype)".
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

MUTANT = Mutant("PREC-001", ["test_64_true_casts_floating_tensors_as_double_does"], cells=F64, blind="batch 3")


class _OnePathForTrue(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        if self.param_dtype is torch.float64:
            return module.to(dtype=torch.float64)
        return super().convert_module(module)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _OnePathForTrue(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
