"""BWD-002 broken: only a mixed-precision context takes its backward out of autocast; a true precision leaves it be.

The framework ties "leave autocast for the backward" to its mixed-precision plugin: 64-true, 32-true and bf16-true
never open an autocast region, so their backward was left as a plain ``loss.backward()``. A user who opens a region
of their own around forward and ``opt.backward(loss)`` in a 32-true context gets autograd under that region, and the
backward of a float32 block runs in bfloat16.
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
from mutants._declared import Mutant

MUTANT = Mutant("BWD-002", ["test_backward_runs_outside_autocast[own-region]"], blind="contract 2026.12.5")


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        mixed = self.parts.precision.autocast_dtype is not None
        hooks = self.parts.hooks
        with outside_autocast(self.device) if mixed else nullcontext():
            self.parts.refusals.check_backward(self, loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
            with self.parts.scaling.backward():
                backward(*args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
