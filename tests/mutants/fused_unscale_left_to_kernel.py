"""AMP-002 broken: a fused optimizer's gradients are not unscaled before its step; the fused kernel unscales them.

``GradScaler.step`` hands a fused optimizer (``_step_supports_amp_scaling``) the scale, and its kernel divides the
gradients by it, so skipping ``unscale_`` for fused optimizers looks like a free optimisation: the parameters come
out right. But ``unscale_gradients()`` then leaves the window's gradients scaled (a hand-written clip, or the
configured one, meets gradients ``scale`` times too large), which the contract forbids.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _unscale(self, slot: Slot) -> None:
        if getattr(slot.optimizer, "_step_supports_amp_scaling", False):
            return
        super()._unscale(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
