"""PROXY-001 broken: the wrapper's class derives from the optimizer's nearest ``torch.optim`` class, not its own.

As a framework that keeps one wrapper class per built-in optimizer: right for ``torch.optim.Adam``; for a user's
subclass of SGD the wrapper is an ``SGD`` but not an instance of the user's class.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.wrapper import wrapper_class
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PROXY-001", ["test_every_kind_is_an_instance_of_its_own_class"])


def _builtin_base(cls: type[torch.optim.Optimizer]) -> type[torch.optim.Optimizer]:
    for base in cls.__mro__:
        if base.__module__.startswith("torch.optim") and issubclass(base, torch.optim.Optimizer):
            return base
    return cls


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_class(_builtin_base(type(self.windows.all[index].optimizer)))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
