"""CLOS-001 broken: on a real step the closure runs, then is passed to the inner ``step`` which runs it again.

The ``optimizer.step(closure=closure)`` of frameworks whose precision plugin has already evaluated it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        if closure is None:
            super()._inner_step(index, closure, kwargs)
        else:
            self._slots[index].optimizer.step(lambda: self._run_closure(index, closure), **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
