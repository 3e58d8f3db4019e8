"""CLIP-002 broken: ``unscale_gradients()`` is not remembered, and the real step repeats it.

It divides the gradients by the scale itself, unknown to the ``GradScaler``, whose ``step`` then unscales them
again; nor does it pin the window, so a following ``step()`` that does not close it accumulates silently.
"""

from __future__ import annotations

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _unscale_gradients(self, index: int) -> None:
        if self.scaler is None:
            return
        inverse = 1.0 / self.scaler.get_scale()
        with torch.no_grad():
            for param in self._slots[index].params():
                if param.grad is not None:
                    param.grad.mul_(inverse)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
