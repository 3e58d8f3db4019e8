"""FSDP-003 broken: clipping by norm takes each rank's norm of its own shards, not the global norm.

As a loop that runs ``clip_grad_norm_`` over ``grad.to_local()``: every rank scales its shards by a different
coefficient.
"""

from __future__ import annotations

import torch
from torch.distributed.tensor import DTensor

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _clip(self, slot: Window) -> None:
        if self._clip_val is None:
            return
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in slot.params()]
        local = [grad for grad in grads if grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(grad) for grad in local]))
        coefficient = torch.clamp(self._clip_val / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            for grad in local:
                grad.mul_(coefficient)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
