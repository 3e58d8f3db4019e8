"""BWD-001 broken: ``w.backward(loss, ...)`` calls ``loss.backward()`` and drops every other argument.

``retain_graph``, ``inputs``, ``gradient`` and ``create_graph`` are silently ignored.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("BWD-001", ["test_backward_forwards_its_arguments"])


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        super().backward(wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
