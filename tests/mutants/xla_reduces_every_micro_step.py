"""XLA-001 broken: the gradients are reduced across replicas after every backward, not once per window.

Accelerate on TPUs: every micro-step all-reduces its gradients, so a window of three costs three reductions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        result = super()._run_closure(index, closure, sync_grad)
        self._device.reduce_gradients(self._slots[index].optimizer)
        return result

    def _reduce_gradients(self, slot: Slot) -> None:
        pass  # reduced in _run_closure instead


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
