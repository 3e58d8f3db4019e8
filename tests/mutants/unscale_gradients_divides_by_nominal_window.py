"""CLIP-002 broken: ``unscale_gradients()`` divides the window by ``accumulate_grad_batches``, not by its length.

Before its closing ``step()`` the implementation does not know yet how the window closes, so it assumes the
configured length: right for a full window, wrong for one cut short by ``make_optimizer_step=True`` or flushed by
the last batch of an epoch (a window of two in a schedule of three applies two thirds of its mean). It is the
``loss / accumulate_grad_batches`` normalisation that Lightning's manual-optimization examples write, which
under-weights every partial window. The real step's own normalisation (no ``unscale_gradients()``) stays right.
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
            normalise_window(slot.params(), self._accumulate_grad_batches)  # the configured length, not the window's


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
