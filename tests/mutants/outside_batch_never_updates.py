"""AMP-003 broken: outside any ``batch()`` the loss scaler is never updated; only leaving a ``batch()`` updates it.

An implementation that ties the update to the end of its loop's iteration: a plain loop without ``batch()`` never
ends one, so after an overflow the scale never backs off (every later step skips again at a scale known to be too
large) and it never grows. It is PyTorch's AMP recipe without its ``scaler.update()`` line, the slip in a
hand-written loop that the rationale of AMP-003 names (an overflowing optimizer kept skipping).
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    _finishing = False

    def _finish_real_step(self, slot: Slot) -> None:
        self._finishing = True
        try:
            super()._finish_real_step(slot)
        finally:
            self._finishing = False

    def _end_iteration(self) -> None:
        if not self._finishing:  # called from a real step outside any batch(): no update there
            super()._end_iteration()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
