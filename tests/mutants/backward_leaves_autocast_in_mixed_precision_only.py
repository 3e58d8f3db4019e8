"""BWD-002 broken: only a mixed-precision context takes its backward out of autocast; a true precision leaves it be.

The framework ties "leave autocast for the backward" to its mixed-precision plugin: 64-true, 32-true and bf16-true
never open an autocast region, so their backward was left as a plain ``loss.backward()``. A user who opens a region
of their own around forward and ``opt.backward(loss)`` in a 32-true context gets autograd under that region, and the
backward of a float32 block runs in bfloat16.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Any

import torch

from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _wrapper_backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        mixed = self._plugin.autocast_dtype is not None
        hooks = self._hooks
        with outside_autocast(self.device) if mixed else nullcontext():
            if not hooks.before_backward and not hooks.after_backward:
                self._backward(loss, *args, **kwargs)
                return
            self._check_backward(loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            self._backward(loss, *args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
