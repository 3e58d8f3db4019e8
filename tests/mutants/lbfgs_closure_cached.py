"""CLOS-002 broken: LBFGS gets a closure that was evaluated once and returns the cached loss every time.

LBFGS then line-searches on stale gradients and a stale loss instead of re-evaluating the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _cached: tuple[object, Any] | None = None

    def _evaluate_closure(self, index: int, closure: Callable[[], T]) -> T:
        if self._cached is None or self._cached[0] is not self._call:
            self._cached = (self._call, super()._evaluate_closure(index, closure))
        result: T = self._cached[1]  # the first evaluation's loss, whatever LBFGS changed since
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
