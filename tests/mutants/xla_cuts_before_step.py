"""XLA-001 broken: the real step cuts the lazy graph after the reduction but before the inner optimizer steps.

A ``torch_xla.sync()`` in the pre-step hook (where a precision plugin finishes the closure's work), and none after
``optimizer.step()``: the update is only recorded, and runs with the next window's graph, or whenever something
reads the parameters. One cut per window, as counted, but in the wrong place.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _reduce_gradients(self, slot: Slot) -> None:
        super()._reduce_gradients(slot)
        self._device.after_step()  # torch_xla.sync() on XLA

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> Any:
        slot = self._slots[index]
        if closure is not None:
            return slot.optimizer.step(closure, **kwargs)
        slot.skipped = not self._scaling.step(slot.optimizer, slot.optimizer.step, kwargs)
        return None  # no graph cut after the step


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
