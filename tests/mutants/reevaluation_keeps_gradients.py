"""CLOS-004 broken: when the inner optimizer evaluates the closure again, the gradients are not cleared first.

A two-pass optimizer's second gradient is then the sum of both points' gradients (a closure written for
Lightning does not zero): SAM steps with the wrong gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _replay(self, index: int, closure: Callable[[], T], result: T) -> Callable[[], T]:
        calls = 0

        def evaluate() -> T:
            nonlocal calls
            calls += 1
            call = self._call
            if calls == 1 or call is None:
                return result
            call.reevaluating = True
            try:
                loss = self._run_closure(index, closure, sync_grad=True)
                self._reduce_gradients(self._slots[index])
                self._clip(self._slots[index])
                return loss
            finally:
                call.reevaluating = False

        return evaluate


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
