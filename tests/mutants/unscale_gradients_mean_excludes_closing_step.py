"""CLIP-002 broken: ``unscale_gradients()`` divides the window by the micro-steps taken so far, not the closing one.

The window's length is counted in ``step()`` calls; ``unscale_gradients()`` between the window's last backward and
its closing ``step()`` divides by the calls made before it, leaving the closing micro-step out of the count: a
window of three applies 1.5 times its mean. A window of one (no earlier call) is its own mean and looks right.
"""

from __future__ import annotations

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import Slot, UnscaleGradientsContext, mutant_info


class Context(UnscaleGradientsContext):
    def _normalise_window(self, slot: Slot) -> None:
        if not self.unscaling:
            super()._normalise_window(slot)
        else:
            normalise_window(slot.params(), max(slot.pending, 1))  # the closing micro-step not counted


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
