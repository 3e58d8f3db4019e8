"""CLOS-001 broken: only the closure of a step that closes its window runs under the context's autocast.

The autocast region is entered on the real-step path (next to the loss scaler and the gradient sync), so the
closures of accumulating micro-steps compute their forward pass in float32 under the mixed precisions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        if sync_grad:  # the closure of a real step
            return super()._run_closure(index, closure, sync_grad)
        with self._toggle(index, sync_grad=sync_grad):
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
