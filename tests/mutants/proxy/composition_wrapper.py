"""PROXY-001 broken: the wrapper is a plain proxy object, not an instance of the inner optimizer's class.

It is a ``torch.optim.Optimizer`` and forwards everything, but ``isinstance(w, torch.optim.Adam)`` is false.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-001", ["test_isinstance_of_the_inner_class"])


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return WrappedOptimizer(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
