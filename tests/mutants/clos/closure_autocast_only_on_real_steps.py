"""CLOS-001 broken: only the closure of a step that closes its window runs under the context's autocast.

The autocast region is entered on the real-step path (next to the loss scaler and the gradient sync), so the
closures of accumulating micro-steps compute their forward pass in float32 under the mixed precisions.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("CLOS-001", ["test_closure_runs_once_in_the_autocast_region", ORACLE_PROPERTY], cells=F16)

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        if call.real:  # the closure of a real step
            return super().run_closure(call, index, closure)
        parts = self.parts
        watch: AbstractContextManager[None] = (
            parts.scaling.watch(parts.parallel.window_tensors(call.window))
            if parts.scaling.changes_gradients
            else nullcontext()
        )
        with parts.toggling.region(self, index, sync_grad=False), watch:  # no autocast region
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
