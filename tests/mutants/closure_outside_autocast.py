"""CLOS-001 broken: the closure runs outside the context's autocast region.

The behaviour of most wrappers (and of this project's reference before contract 2026.12): ``step`` calls the closure
as it is, so a closure that does not enter ``context.autocast()`` itself computes its forward pass in float32 under
16-mixed and bf16-mixed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        with self._toggle(index, sync_grad=sync_grad):
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
