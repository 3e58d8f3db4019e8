"""XLA-001 broken: the gradients are reduced only on real steps that the accumulation schedule foresees.

The reduction is tied to the schedule (``(batch_idx + 1) % accumulate_grad_batches == 0``), as a DDP-style
``require_backward_grad_sync`` flag decided by the loop would be: a window cut short by ``make_optimizer_step=True``
and the partial last window flushed by the epoch's last batch are stepped on each replica's own gradients.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _reduce_gradients(self, slot: Slot) -> None:
        position = self._position
        if position is None or (position.batch_idx + 1) % self._accumulate_grad_batches == 0:
            super()._reduce_gradients(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
