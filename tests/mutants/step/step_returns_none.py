"""STEP-006 broken: ``step`` returns ``None`` (like a bare ``Optimizer.step()``), not the closure's result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("STEP-006", ["test_step_returns_the_closure_result", "test_lbfgs_evaluates_the_closure_itself"])

T = TypeVar("T")


class Wrapper(WrappedOptimizer[Any]):
    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        super().step(closure, make_optimizer_step, **kwargs)
        return None


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
