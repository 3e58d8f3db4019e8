"""ZERO-005 broken: a wrapper's ``backward()`` takes the carried part of every window, toggled-off ones included.

Reading the first version of ZERO-005 ("at the first ``backward()`` of any wrapper of the context"): any backward
starts every window that has gradients left. Inside the generator's closure the discriminator's parameters are
toggled off (TOGGLE-001), so the backward cannot reach them; taking D's gradients there moves them off D's parameters
while they are still the user's: ``d.grad`` reads ``None`` although D's last step left it and no ``zero_grad()`` ran
(ZERO-004), a state taken then holds them as context state (ZERO-007 says they are the user's), and an in-place change
the user makes before D's own step is no longer refused (ZERO-006). The amended ZERO-005: a backward takes a window
only "while one of the window's parameters requires grad (not toggled off, TOGGLE-001)".
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
        "test_gradients_changed_in_place_before_they_were_taken_are_refused[loss.backward() before step()-discard]",
        "test_gradients_changed_in_place_before_they_were_taken_are_refused[loss.backward() before step()-restore]",
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
            carrying = [window for window in self.windows if window.left is not None]
            for window in carrying:
                parts.zeroing.check_take(window)
            for window in carrying:
                parts.zeroing.take(window)
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
