"""CLIP-001 broken: configured clipping is applied to the window's summed gradients, before the mean is taken.

A framework that clips in its "before optimizer step" hook and averages the accumulated gradients afterwards (or
averages inside the optimizer's step): with a window of ``k`` micro-steps the threshold meets gradients ``k`` times
too large, so the step applies ``1/k`` of the clipped norm. Windows of one micro-step, the only ones a clipping
check without accumulation tries, are unaffected.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _prepare_gradients(self, slot: Slot) -> None:
        self._reduce_gradients(slot)
        self._unscale(slot)
        self._clip(slot)
        self._normalise_window(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
