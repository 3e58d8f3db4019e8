"""HOOK-001 broken: ``before_backward`` runs after autograd, just before ``after_backward``.

As a wrapper that fires both hooks once the backward returned: a hook that must act before the gradients exist
(DDP's reducer preparation, Lightning's ``on_before_backward``) acts too late.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.precision import outside_autocast
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-001", ["test_hooks_follow_every_backward_and_step"])


class Context(MutantContext):
    @override
    def backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        hooks = self.parts.hooks
        with outside_autocast(self.device):
            self.parts.refusals.check_backward(self, loss)
            backward: Callable[..., None] = self.parts.scaling.scale(loss, self.accumulate_grad_batches).backward
            with self.parts.scaling.backward():
                backward(*args, **kwargs)
            hooks.run_backward(hooks.before_backward, wrapper, loss)
            hooks.run_backward(hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
