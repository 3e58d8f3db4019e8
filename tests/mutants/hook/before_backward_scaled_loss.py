"""HOOK-001 broken: the backward hooks receive the loss as autograd gets it (scaled under 16-mixed), not as passed.

The implementer scales the loss first and then brackets "the backward of that tensor" with the hooks, since the
hooks are "around autograd". Outside 16-mixed the two are the same object, so every 32-true check passes; under
16-mixed a framework logging the loss in ``on_before_backward`` sees it multiplied by the scale (and divided by N).
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "HOOK-001",
    [
        "test_hooks_follow_every_backward_and_step[windows 1, 3, 2 by make_optimizer_step]",
        "test_hooks_follow_every_backward_and_step[schedule of 2 inside batch()]",
        "test_hooks_follow_every_backward_and_step[windows 2, 1, 3 and the flushed last]",
    ],
    cells=F16,
    blind="batch 1",
)


class Context(MutantContext):
    @override
    def backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        parts = self.parts
        hooks = parts.hooks
        with outside_autocast(parts.device.torch_device):
            parts.refusals.check_backward(self, loss)
            scaled = parts.scaling.scale(loss, parts.accumulation.accumulate_grad_batches)
            if hooks.before_backward:
                hooks.run_backward(hooks.before_backward, wrapper, scaled)  # the defect: scaled, not as passed
            with parts.scaling.backward():
                scaled.backward(*args, **kwargs)
            if hooks.after_backward:
                hooks.run_backward(hooks.after_backward, wrapper, scaled)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
