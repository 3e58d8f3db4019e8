"""CLIP-001 broken: configured clipping is applied to the scaled gradients, before unscaling.

Lightning before 1.2 clipped in the training loop before the precision plugin unscaled: under 16-mixed the clip
threshold meets gradients ``scale`` times too large, so the step applies a uselessly small update.
"""

from __future__ import annotations

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _prepare_gradients(self, slot: Slot) -> None:
        if slot.prepared:
            return
        self._normalise_window(slot)
        self._device.reduce_gradients(slot.optimizer)
        if self._clip_val is not None:
            clip_gradients(slot.params(), self._clip_val, self._clip_algorithm)
        if self._scaler is not None and any(param.grad is not None for param in slot.params()):
            self._scaler.unscale(slot.optimizer)
        slot.prepared = True


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
