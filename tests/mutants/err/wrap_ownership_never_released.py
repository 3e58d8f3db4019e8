"""ERR-010 broken: the registry of wrapped optimizers holds them strongly; one stays taken after its context is gone.

A plain set of every optimizer ever wrapped, instead of weak references to the contexts that wrap them: an optimizer
whose training context was dropped cannot be wrapped by a new one.
"""

from __future__ import annotations

from typing import TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ERR-010",
    ["test_wrap_of_an_optimizer_another_context_wraps", "test_an_optimizer_is_wrapped_once_while_its_context_lives"],
)

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)

_EVER_WRAPPED: list[torch.optim.Optimizer] = []


class Context(MutantContext):
    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        mine = any(window.optimizer is optimizer for window in self.windows)
        if not mine and any(taken is optimizer for taken in _EVER_WRAPPED):
            raise ValueError(f"this {type(optimizer).__name__} is already wrapped by another training context")
        wrapper = super().wrap(optimizer)
        _EVER_WRAPPED.append(optimizer)
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
