"""ERR-004 broken: wrapping a wrapper unwraps it and wraps its inner optimizer instead of raising ``TypeError``.

A second context then silently shares the inner optimizer with the first.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ERR-004", ["test_wrapping_a_wrapper"])


class Context(MutantContext):
    @override
    def wrap(self, optimizer: Any) -> WrappedOptimizer[Any]:
        if isinstance(optimizer, WrappedOptimizer):
            inner: torch.optim.Optimizer = optimizer.optimizer
            return super().wrap(inner)
        return super().wrap(optimizer)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
