"""PREC-003 broken: bf16-mixed never enters bfloat16 autocast; the forward pass runs in float32.

The precision is read only to pick the parameter dtype: ``context.autocast()`` returns a null context, so
bf16-mixed trains exactly like 32-true.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant("PREC-003", ["test_bf16_mixed_is_autocast_only"], cells=BF16_MIXED)


class Context(MutantContext):
    @override
    def autocast(self) -> AbstractContextManager[None]:
        if self.precision == "bf16-mixed":
            return nullcontext()
        return super().autocast()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
