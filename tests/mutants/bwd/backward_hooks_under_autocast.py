"""BWD-002 broken for the hooks: autograd leaves autocast, the backward hooks around it run inside the region.

Lightning's ``on_before_backward`` and ``on_after_backward`` (gradient norms logged, gradients inspected or
changed) then compute under autocast, where its own loop runs them outside.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant("BWD-002", ["test_backward_hooks_run_outside_autocast"], cells=BF16_MIXED)


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self.parts.hooks
        self.parts.refusals.check_backward(self, loss)
        hooks.run_backward(hooks.before_backward, wrapper, loss)
        with outside_autocast(self.device):
            backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
            with self.parts.scaling.backward():
                backward(*args, **kwargs)
        hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
