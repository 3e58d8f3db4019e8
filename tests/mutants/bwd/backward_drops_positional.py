"""BWD-001 broken: ``w.backward(loss, ...)`` forwards only keyword arguments to ``loss.backward``.

A wrapper written as ``def backward(self, loss, **kwargs)`` behind a ``*args`` facade: ``w.backward(loss, gradient)``
and ``w.backward(loss, None, True)`` lose their positional ``gradient`` and ``retain_graph``.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("BWD-001", ["test_backward_call_forms"])


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        super().backward(wrapper, loss, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
