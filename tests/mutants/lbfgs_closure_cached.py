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
    def _closure_evaluating_step(self, index: int, closure: Callable[[], T], kwargs: dict[str, Any]) -> T:
        loss = self._run_closure(index, closure)
        return super()._closure_evaluating_step(index, lambda: loss, kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
