"""ZERO-005 broken: a wrapper's ``backward()`` takes the carried part of its own window only.

Reasoning: "a window takes its carried part at its wrapper's first call", so ``opt_a.backward(loss)`` takes A's and
nothing else. ZERO-005 says the first ``backward()`` of *any* wrapper of the context takes it, for every window one of
whose parameters requires grad: a generator loss backpropagated through ``opt_g.backward`` outside a closure also
reaches the discriminator's parameters and accumulates into the gradients D's last step left. Under this mutant D's
later ``step()`` finds them changed in place and refuses (ZERO-006) a loop the contract accepts.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_gradients_changed_in_place_before_they_were_taken_are_refused"
        "[grad.mul_(2), then the other wrapper's backward-discard]",
        "test_gradients_changed_in_place_before_they_were_taken_are_refused"
        "[grad.mul_(2), then the other wrapper's backward-restore]",
    ],
    blind="batch 3",
)


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        parts = self.parts
        hooks = parts.hooks
        with outside_autocast(parts.device.torch_device):
            parts.refusals.check_backward(self, loss)
            window = self.windows[wrapper.window_index]
            if window.left is not None:
                parts.zeroing.take(window)  # the calling wrapper's window starts here
            if hooks.before_backward:
                hooks.run_backward(hooks.before_backward, wrapper, loss)
            backward: Callable[..., None] = parts.scaling.scale(
                loss, parts.accumulation.accumulate_grad_batches
            ).backward
            with parts.scaling.backward():
                backward(*args, **kwargs)
            if hooks.after_backward:
                hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
