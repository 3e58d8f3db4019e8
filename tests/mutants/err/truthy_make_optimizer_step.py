"""ERR-002 broken: ``make_optimizer_step`` is coerced with ``bool(...)`` instead of being type-checked.

``1``, ``"yes"`` or a tensor is taken for ``True`` (and ``0`` for ``False``) without an error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("ERR-002", ["test_non_bool_make_optimizer_step"])

T = TypeVar("T")


class Wrapper(WrappedOptimizer[Any]):
    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        flag = None if make_optimizer_step is None else bool(make_optimizer_step)
        return super().step(closure, flag, **kwargs)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
