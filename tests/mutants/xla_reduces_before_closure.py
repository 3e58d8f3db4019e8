"""XLA-001 broken: the real step reduces the gradients before its closure runs the window's last backward.

Lightning 1.1 on TPUs: ``xm.optimizer_step(optimizer, optimizer_args={"closure": closure})`` reduces first and
only then steps, which runs the closure: the last micro-batch's gradients are never reduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        if sync_grad:
            self._device.reduce_gradients(self._slots[index].optimizer)
        return super()._run_closure(index, closure, sync_grad)

    def _prepare_gradients(self, slot: Slot) -> None:
        if slot.prepared:
            return
        self._normalise_window(slot)
        if self._scaler is not None and any(param.grad is not None for param in slot.params()):
            self._scaler.unscale(slot.optimizer)
        if self._clip_val is not None:
            clip_gradients(slot.params(), self._clip_val, self._clip_algorithm)
        slot.prepared = True


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
