"""BWD-002 broken, half-fixed: ``wrapper.backward`` leaves autocast in the backward-then-step form only.

A framework that moved the user's ``opt.backward(loss)`` out of autocast, but still runs the closure's backward
inside the region the closure runs in (the automatic-style closure of Lightning's loop, the proposal's closures).
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
    "BWD-002",
    ["test_backward_runs_outside_autocast[closure]", "test_gan_iteration_in_one_autocast_region[closure-iteration]"],
    cells=BF16_MIXED,
)


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if self.windows.call is None:
            super().backward(wrapper, loss, *args, **kwargs)
            return
        hooks = self.parts.hooks
        self.parts.refusals.check_backward(self, loss)
        hooks.run_backward(hooks.before_backward, wrapper, loss)
        backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
        with self.parts.scaling.backward():
            backward(*args, **kwargs)
        hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
