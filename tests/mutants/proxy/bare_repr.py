"""PROXY-005 broken: ``repr`` shows the wrapper's settings but not which optimizer it wraps."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-005", ["test_repr_names_the_inner_class_beyond_the_wrapper_class"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def __repr__(self) -> str:
        return f"OptimizerWrapper(precision={self.training_context.precision!r})"


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
