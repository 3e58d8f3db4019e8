"""CLIP-001 broken: each real step clips the gradients of every wrapped optimizer, the whole model's.

``clip_grad_norm_(model.parameters(), max_norm)`` before ``optimizer.step()``, as training scripts and Accelerate's
``accelerator.clip_grad_norm_(model.parameters(), ...)`` do: with several optimizers, the norm includes the other
optimizers' gradients (under 16-mixed still scaled, in their open windows), and those gradients are clipped too,
so another optimizer's open window changes while it accumulates.
"""

from __future__ import annotations

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _clip(self, slot: Slot) -> None:
        if self._clip_val is not None:
            everything = [param for other in self._slots for param in other.params()]
            clip_gradients(everything, self._clip_val, self._clip_algorithm)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
