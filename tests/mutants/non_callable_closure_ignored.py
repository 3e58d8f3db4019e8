"""ERR-001 broken: a closure that is not callable is silently treated as no closure.

``if callable(closure): closure()``: a mistaken argument turns the call into a closure-less step, with no error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        return super()._step(index, closure if callable(closure) else None, make_optimizer_step, kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
