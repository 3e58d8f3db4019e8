"""BWD-002 broken: ``wrapper.backward`` leaves autocast in a step's closure only, not in the backward-then-step form.

The framework reasoned that the only autocast region it is responsible for is the one it opens itself around the
closure, so it disables autocast for a backward only while a ``step()`` is running. A backward called inside
``context.autocast()`` (a GAN iteration in one region, backward then ``step()``), or inside a region the user
opened, runs autograd and the backward hooks under autocast.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant(
    "BWD-002",
    ["test_backward_runs_outside_autocast[context-region]", "test_backward_runs_outside_autocast[own-region]"],
    cells=BF16_MIXED,
    blind="contract 2026.12.5",
)


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        in_closure = self.windows.call is not None
        hooks = self.parts.hooks
        with outside_autocast(self.device) if in_closure else nullcontext():
            self.parts.refusals.check_backward(self, loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
            with self.parts.scaling.backward():
                backward(*args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
