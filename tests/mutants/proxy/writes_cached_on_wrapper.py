"""PROXY-003 broken: an attribute assigned through the wrapper is set on the inner optimizer and kept on the wrapper.

As a proxy that writes through but also caches the value in its own ``__dict__`` (so that reads are fast): the
inner optimizer sees the assignment, but when the inner's attribute changes later the wrapper still reads its
stale copy.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-003", ["test_assignments_reach_only_their_inner_optimizer"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if not name.startswith("_") and name not in vars(type(self)) and name != "step":
            object.__setattr__(self, name, value)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
