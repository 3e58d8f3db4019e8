"""XLA-001 broken: the gradients are reduced across replicas after every backward, not once per window.

Accelerate on TPUs: every micro-step all-reduces its gradients, so a window of three costs three reductions.
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
        result = super()._run_closure(index, closure, sync_grad)
        self._device.reduce_gradients(self._slots[index].optimizer)
        return result

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
