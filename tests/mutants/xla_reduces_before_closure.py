"""XLA-001 broken: the real step reduces the gradients before its closure runs the window's last backward.

Lightning 1.1 on TPUs: ``xm.optimizer_step(optimizer, optimizer_args={"closure": closure})`` reduces first and
only then steps, which runs the closure: the last micro-batch's gradients are never reduced.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        if sync_grad:
            self._device.reduce_gradients(self._slots[index].optimizer)
        return super()._run_closure(index, closure, sync_grad)

    def _reduce_gradients(self, slot: Slot) -> None:
        pass  # reduced in _run_closure instead


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
