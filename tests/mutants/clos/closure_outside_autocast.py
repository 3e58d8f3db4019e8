"""CLOS-001 broken: the closure runs outside the context's autocast region.

The behaviour of most wrappers (and of this project's reference before contract 2026.12): ``step`` calls the closure
as it is, so a closure that does not enter ``context.autocast()`` itself computes its forward pass in float32 under
16-mixed and bf16-mixed.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("CLOS-001", ["test_closure_runs_once_in_the_autocast_region", ORACLE_PROPERTY], cells=BF16_MIXED)

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        parts = self.parts
        watch: AbstractContextManager[None] = (
            parts.scaling.watch(parts.parallel.window_tensors(call.window))
            if parts.scaling.changes_gradients
            else nullcontext()
        )
        with parts.toggling.region(self, index, sync_grad=call.real), watch:  # no autocast region
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
