"""CLIP-002 broken: ``unscale_gradients()`` in the closing step's closure divides the window by ``k + 2``.

An implementation that counts a micro-step when its ``step()`` begins, and whose ``unscale_gradients()`` adds the
closing micro-step to the count as if it had not been counted: called between the window's last backward and a
closure-less ``step()`` it divides by ``k + 1`` (right), called inside the closing step's closure by ``k + 2``, so
a window of one applies half its gradient there. It is the off-by-one of a loop counter advanced before the closure
runs (frameworks that count the batch when the optimizer step begins): only the closure form shows it.
"""

from __future__ import annotations

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    _in_closing_closure = False

    def _unscale_gradients(self, index: int) -> None:
        self._in_closing_closure = self._slots[index].stage is WindowStage.CLOSING
        try:
            super()._unscale_gradients(index)
        finally:
            self._in_closing_closure = False

    def _normalise_window(self, slot: Slot) -> None:
        if not self._in_closing_closure:
            super()._normalise_window(slot)
        else:
            normalise_window(slot.params(), slot.pending + 2)  # the closing micro-step counted twice


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
