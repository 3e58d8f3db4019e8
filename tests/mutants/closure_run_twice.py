"""CLOS-001 broken: on a real step the closure runs, then is passed to the inner ``step`` which runs it again.

The ``optimizer.step(closure=closure)`` of frameworks whose precision plugin has already evaluated it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _closure: Callable[[], Any] | None = None

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        self._closure = closure
        return super()._run_closure(index, closure, sync_grad)

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        given, self._closure = self._closure, None
        if closure is not None or given is None:
            return super()._inner_step(index, closure, kwargs)
        user_closure = given
        return self._slots[index].optimizer.step(
            lambda: super(Context, self)._run_closure(index, user_closure), **kwargs
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
