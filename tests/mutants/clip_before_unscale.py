"""CLIP-001 broken: configured clipping is applied to the scaled gradients, before unscaling.

Lightning before 1.2 clipped in the training loop before the precision plugin unscaled: under 16-mixed the clip
threshold meets gradients ``scale`` times too large, so the step applies a uselessly small update.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _unscale(self, slot: Slot) -> None:
        super()._clip(slot)
        super()._unscale(slot)

    def _clip(self, slot: Slot) -> None:
        pass


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
