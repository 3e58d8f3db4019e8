"""AMP-007 broken: under 16-mixed a window longer than ``accumulate_grad_batches`` is applied as its sum over ``N``.

The framework divides each loss by ``N`` in backward, as the recipe does, and then rescales the windows it expects
to be short: one cut short by ``make_optimizer_step=True`` or flushed at the epoch's last batch gets ``N / k``. It
assumed the schedule never lets a window run past ``N`` micro-steps and clamps the length to ``N``; a window that
``make_optimizer_step=False`` kept open longer applies ``k / N`` times its mean.
"""

from __future__ import annotations

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _normalise_window(self, slot: Window) -> None:
        divisor = self._window_divisor()
        length = slot.pending + 1
        if divisor > 1:
            length = min(length, divisor)  # "a window closes at N micro-steps at the latest"
        normalise_window(slot.params(), length, divided_by=divisor)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
