"""PREC-001 broken: 64-true casts with ``module.to(torch.float64)``, which makes complex tensors real.

``module.to(dtype)`` is the one cast the other ``-true`` precisions use, so the implementer uses it for 64-true too;
unlike ``module.double()`` (Lightning's 64-true) it casts complex parameters and buffers as well, discarding their
imaginary part with only torch's ``ComplexWarning`` said.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

MUTANT = Mutant("PREC-001", ["test_64_true_casts_floating_tensors_as_double_does"], cells=F64)


class _ToDouble(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.to(torch.float64)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        if p.name == "64-true":
            self.parts.precision = _ToDouble(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
