"""CLOS-001 broken: the closure handed to the inner optimizer runs the call's closure again on its first call.

As a wrapper that passes the user's closure straight through to ``optimizer.step(closure)`` after running it
itself: each real step runs the closure twice, and the second run's gradients (of the last micro-batch alone)
replace the window's mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _replay(self, index: int, closure: Callable[[], T], result: T) -> Callable[[], T]:
        def evaluate() -> T:
            call = self._call
            assert call is not None
            call.reevaluating = True
            try:
                return self._evaluate_closure(index, closure)
            finally:
                call.reevaluating = False

        return evaluate


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
