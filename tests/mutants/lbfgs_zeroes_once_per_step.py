"""CLOS-004 broken: an LBFGS step zeroes the gradients once, before its first evaluation, not before each one.

As a training loop that calls ``optimizer.zero_grad()`` once per step and leaves the rest to the closure (Lightning's
automatic optimization before its closure took over the zeroing): with a closure that does not zero, each of
LBFGS's later evaluations adds its gradients to the previous ones', so the line search and the curvature pairs see
sums of gradients of other points. A single evaluation (``max_iter=1``) or a closure that zeroes hides it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.zeroed_in: object = None
        """The step call whose first evaluation zeroed the gradients."""

    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        if self.zeroed_in is not self._call:
            self.zeroed_in = self._call
            self._slots[index].optimizer.zero_grad(set_to_none=True)
        loss = self._run_closure(index, closure, sync_grad=True)
        self._reduce_gradients(self._slots[index])
        self._clip(self._slots[index])
        return loss


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
