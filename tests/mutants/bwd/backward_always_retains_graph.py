"""BWD-001 broken: ``w.backward`` always passes ``retain_graph=True``.

The pattern of a wrapper that keeps every graph so that a closure can be re-run (by LBFGS, or by a retry after a
failed step): a plain ``w.backward(loss)`` no longer frees the graph, as ``loss.backward()`` does, so memory grows
and a second backward through the same graph silently succeeds.
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
        if len(args) >= 2:
            args = (args[0], True, *args[2:])
        else:
            kwargs["retain_graph"] = True
        super().backward(wrapper, loss, *args, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
