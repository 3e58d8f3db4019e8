"""ERR-002 broken: ``make_optimizer_step`` is coerced with ``bool(...)`` instead of being type-checked.

``1``, ``"yes"`` or a tensor is taken for ``True`` (and ``0`` for ``False``) without an error.
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
        flag = None if make_optimizer_step is None else bool(make_optimizer_step)
        return super()._step(index, closure, flag, kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
