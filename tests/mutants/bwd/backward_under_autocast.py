"""BWD-002 broken: ``wrapper.backward`` runs autograd where it is called, inside the autocast region.

The reference until contract 2026.12.5: a closure runs inside the context's autocast region, and so did its
backward. Every op of the backward is then autocast too: the backward of a block the forward ran in float32 (with
autocast disabled) computes in the low precision, and the gradients differ from torch's recipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant(
    "BWD-002", ["test_backward_runs_outside_autocast", "test_backward_hooks_run_outside_autocast"], cells=BF16_MIXED
)


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self.parts.hooks
        self.parts.refusals.check_backward(self, loss)
        hooks.run_backward(hooks.before_backward, wrapper, loss)
        backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
        with self.parts.scaling.backward():
            backward(*args, **kwargs)
        hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
