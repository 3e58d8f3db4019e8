"""AMP-002 broken: the scaled gradients are never unscaled; the inner optimizer steps on them directly.

A loop that scales the loss but calls ``optimizer.step()`` itself instead of ``scaler.step(optimizer)``: every
real step applies gradients ``scale`` (65536) times too large, and clipping sees the scaled values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _unscale(self, slot: Slot) -> None:
        pass

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        self._slots[index].optimizer.step(**kwargs)
        self._device.after_step()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
