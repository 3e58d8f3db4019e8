"""AMP-007 broken, half-fixed: the loss is divided by N for headroom; every window is taken to be N long.

Lightning's automatic loop does this: ``loss / accumulate_grad_batches`` before the scaled backward, and no
correction at the step. A full window applies its mean; one cut short by ``make_optimizer_step=True``, the epoch's
flushed last window, or one made longer by ``False`` applies its sum over N instead (ACC-001).
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _normalise_window(self, slot: Slot) -> None:
        if self._window_divisor() == 1:
            super()._normalise_window(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
