"""PREC-001 broken: 32-true casts the module's floating-point tensors to float32, as ``module.float()`` does.

The contract's earlier reading (32-true "is" float32), kept by an implementation that casts in every ``-true``
precision: a float64 buffer loses its digits and a float64 parameter trains in float32. Lightning's 32-true plugin
converts nothing, and PREC-001 now says so.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PREC-001", ["test_32_true_and_mixed_precisions_convert_nothing"])


class _Float(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.float()


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        if p.name == "32-true":
            self.parts.precision = _Float(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
