"""PROXY-005 broken: the wrapper keeps the default object ``repr``.

``<module.WrappedAdam object at 0x...>`` contains "Adam" only through the wrapper class's own name: the repr says
nothing of the optimizer it wraps (a user's subclass, say), as a wrapper class that defines no ``__repr__`` shows.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-005", ["test_repr_names_the_inner_class_beyond_the_wrapper_class"])


class Wrapper(WrappedOptimizer[Any]):
    __repr__ = object.__repr__


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
