"""FSDP-004 broken: under 16-mixed each rank decides from its own shards whether the step is finite.

As a loop that checks ``torch.isfinite(grad.to_local())`` instead of the scaler's found-inf: a rank whose shards
are finite steps while the rank holding the overflow skips.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slot(index)
        if closure is not None or self.scaler is None:
            return super()._inner_step(index, closure, kwargs)
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in slot.params()]
        slot.skipped = not all(bool(torch.isfinite(grad).all()) for grad in grads if grad is not None)
        if not slot.skipped:
            slot.optimizer.step(**kwargs)
        return None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
