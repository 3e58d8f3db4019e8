"""DDP-001 broken: the DDP sync decision ignores ``is_last``; the last batch's partial window steps unreduced.

The real step flushes the partial window at the end of the epoch, but the closure's ``no_sync()`` is decided
from ``(batch_idx + 1) % accumulate_grad_batches`` alone, as in loops whose sync flag only counts steps and
misses the end of the dataloader (Accelerate before ``sync_with_dataloader``). The flushed window applies each
rank's own gradients, so the ranks drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _sync_decision = True

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        real = super()._closes_window(slot, make_optimizer_step)
        position = self._position
        if make_optimizer_step is None and position is not None:
            self._sync_decision = (position.batch_idx + 1) % self.accumulate_grad_batches == 0
        else:
            self._sync_decision = real
        return real

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        return super()._run_closure(index, closure, sync_grad=self._sync_decision)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
