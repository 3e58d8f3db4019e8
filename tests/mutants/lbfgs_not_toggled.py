"""TOGGLE-001 broken: the evaluations of a closure-evaluating optimizer (LBFGS) are not toggled.

The first-order path toggles around the closure, but the LBFGS path hands LBFGS a closure that only enters the
autocast region: inside every evaluation the other optimizers' parameters still require grad, so LBFGS's
backward passes write into their gradients (an open window of another optimizer included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        with self.autocast():
            loss = closure()
        self._reduce_gradients(self._slots[index])
        self._clip(self._slots[index])
        return loss


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
