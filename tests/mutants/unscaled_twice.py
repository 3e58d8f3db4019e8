"""AMP-002 broken: gradients are unscaled twice, by hand and again by ``scaler.step``.

The window is divided by the scale before clipping, but behind the scaler's back: ``GradScaler.step`` still sees
the optimizer as not unscaled and divides it again, so every real step applies gradients ``scale`` times too small.
"""

from __future__ import annotations

import torch

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _unscale(self, slot: Slot) -> None:
        if self.scaler is not None:
            inverse = 1.0 / self.scaler.get_scale()
            with torch.no_grad():
                for param in slot.params():
                    if param.grad is not None:
                        param.grad.mul_(inverse)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
