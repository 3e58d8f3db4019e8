"""SURFACE-001 broken: the wrapper's ``zero_grad`` keeps the old ``set_to_none=False`` default.

Every call still works, but ``w.zero_grad()`` leaves zero tensors where the contract (and torch >= 2.0) leave
``None``: the signature no longer matches ``OptimizerWrapper.zero_grad``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("SURFACE-001", ["test_wrapper_surface"])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def zero_grad(self, set_to_none: bool = False) -> None:
        super().zero_grad(set_to_none)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
