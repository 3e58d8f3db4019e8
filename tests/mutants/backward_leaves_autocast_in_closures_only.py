"""BWD-002 broken: ``wrapper.backward`` leaves autocast in a step's closure only, not in the backward-then-step form.

The framework reasoned that the only autocast region it is responsible for is the one it opens itself around the
closure, so it disables autocast for a backward only while a ``step()`` is running. A backward called inside
``context.autocast()`` (a GAN iteration in one region, backward then ``step()``), or inside a region the user
opened, runs autograd and the backward hooks under autocast.
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
        in_closure = self._call is not None
        hooks = self._hooks
        with outside_autocast(self.device) if in_closure else nullcontext():
            if not hooks.before_backward and not hooks.after_backward:
                self._backward(loss, *args, **kwargs)
                return
            self._check_backward(loss)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            self._backward(loss, *args, **kwargs)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
