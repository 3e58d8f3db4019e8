"""CLIP-001 broken: a closure-evaluating optimizer (LBFGS) never sees clipped gradients.

Clipping sits in the first-order path, right before the inner step; LBFGS computes its gradients inside its own
``step`` and uses them unclipped (the behaviour of this project's reference before contract 2026.12, and of
wrappers that clip before ``optimizer.step(closure)``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        loss = self._run_closure(index, closure, sync_grad=True)
        self._reduce_gradients(self._slots[index])
        return loss


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
