"""BWD-002 broken: the wrapper's backward leaves autocast only when ``torch.is_autocast_enabled()`` (no device) says so.

The framework copied the long-standing CUDA idiom ``if torch.is_autocast_enabled(): with
torch.autocast(..., enabled=False): ...``. Called without a device, ``torch.is_autocast_enabled()`` reports CUDA's
autocast state only, so on CUDA the backward leaves the region as it should, while on CPU (and XLA) it never does:
the closure's backward, and the hooks around it, run under the context's own autocast, and the backward of a
float32 block computes in the low precision.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant("BWD-002", ["test_backward_runs_outside_autocast"], cells=BF16_MIXED, blind="contract 2026.12.5")


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        leave = (
            torch.autocast(device_type=self.device.type, enabled=False)
            if torch.is_autocast_enabled()  # CUDA's state, whatever the device
            else nullcontext()
        )
        hooks = self.parts.hooks
        with leave:
            self.parts.refusals.check_backward(self, loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
            with self.parts.scaling.backward():
                backward(*args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
