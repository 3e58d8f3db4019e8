"""BWD-001 broken: ``w.backward`` forwards only ``retain_graph`` and ``inputs``.

A wrapper that spells out the arguments it thinks users need (``loss.backward(retain_graph=..., inputs=...)``)
silently drops ``gradient`` (a non-scalar loss then fails) and ``create_graph`` (no higher-order gradients), and
every positional argument.
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
        super().backward(wrapper, loss, retain_graph=kwargs.get("retain_graph"), inputs=kwargs.get("inputs"))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
