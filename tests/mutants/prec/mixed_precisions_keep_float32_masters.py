"""PREC-001 broken: the mixed precisions cast the module to float32 "master weights" (``module.float()``).

Mixed-precision recipes keep float32 master weights, and the implementer makes sure of it by casting every
floating-point tensor to float32 in ``prepare_module``: a float64 parameter then trains in float32 and a bfloat16
one in float32. Lightning's mixed plugins convert nothing (autocast decides the forward's dtypes), and so does PREC-001.
"""

from __future__ import annotations

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import MIXED, Mutant

MUTANT = Mutant("PREC-001", ["test_32_true_and_mixed_precisions_convert_nothing"], cells=MIXED)


class _Masters(PrecisionPlugin):
    @override
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        return module.float()


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        if p.autocast_dtype is not None:
            self.parts.precision = _Masters(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
