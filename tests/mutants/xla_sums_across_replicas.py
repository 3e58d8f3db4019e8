"""XLA-001 broken: the cross-replica reduction sums the window's gradients instead of averaging them.

fairseq's TPU trainer: the gradients are multiplied by the world size before ``xm.reduce_gradients``, so that
torch_xla's mean over replicas becomes a sum (right only where each replica's loss was divided by the global batch
size). Here each replica's loss is a mean over its own batch, so every real step applies ``world_size`` times the
window's mean gradient. With one replica nothing changes.
"""

from __future__ import annotations

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _reduce_gradients(self, slot: Slot) -> None:
        if self.device.type != "xla":
            return
        import torch_xla.runtime as xr

        world_size = xr.world_size()
        with torch.no_grad():
            for param in slot.params():
                if param.grad is not None:
                    param.grad.mul_(world_size)
        super()._reduce_gradients(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
