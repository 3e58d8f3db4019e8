"""ERR-001 broken: a closure that is not callable is silently treated as no closure.

``if callable(closure): closure()``: a mistaken argument turns the call into a closure-less step, with no error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("ERR-001", ["test_non_callable_closure"])

T = TypeVar("T")


class Wrapper(WrappedOptimizer[Any]):
    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        given = closure if callable(closure) else None
        return super().step(given, make_optimizer_step, **kwargs)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
