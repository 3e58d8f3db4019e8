"""CLIP-001 broken: clipping by norm clips each parameter group to the threshold on its own.

The loop ``for group in optimizer.param_groups: clip_grad_norm_(group["params"], max_norm)``, common in training
scripts with per-layer learning rates: each group's norm is bounded instead of the total over all of the
optimizer's parameters, so an optimizer with two groups may apply up to ``sqrt(2)`` times the clipped norm.
"""

from __future__ import annotations

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _clip(self, slot: Slot) -> None:
        if self._clip_val is None:
            return
        for group in slot.optimizer.param_groups:
            clip_gradients(group["params"], self._clip_val, self._clip_algorithm)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
