"""PROXY-003 broken: attribute assignment on the wrapper is stored on the wrapper, not on the inner optimizer.

Reads fall through to the inner optimizer, writes do not: a flag set through the wrapper never reaches it.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-003", ["test_writes_reach_the_inner_optimizer"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def __setattr__(self, name: str, value: Any) -> None:
        object.__setattr__(self, name, value)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
