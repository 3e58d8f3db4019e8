"""CLIP-002 broken: ``unscale_gradients()`` does not apply the configured clipping, and the step then skips it.

Clipping is tied to the step's own unscale: when the user has already prepared the window with
``unscale_gradients()`` (to inspect or clip by hand), the step sees it prepared and goes straight to the inner
step, so ``gradient_clip_val`` silently does nothing on those steps.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import Slot, UnscaleGradientsContext, mutant_info


class Context(UnscaleGradientsContext):
    def _clip(self, slot: Slot) -> None:
        if not self.unscaling:
            super()._clip(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
