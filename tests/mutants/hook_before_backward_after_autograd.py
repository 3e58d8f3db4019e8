"""HOOK-001 broken: ``before_backward`` runs after autograd, just before ``after_backward``.

As a wrapper that fires both hooks once the backward returned: a hook that must act before the gradients exist
(DDP's reducer preparation, Lightning's ``on_before_backward``) acts too late.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _wrapper_backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        self._backward(loss, *args, **kwargs)
        self._hooks.run_backward(self._hooks.before_backward, wrapper, loss)
        self._hooks.run_backward(self._hooks.after_backward, wrapper, loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
