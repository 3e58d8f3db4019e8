"""CLIP-001 broken: configured clipping reaches only the optimizer's first parameter group.

``clip_grad_norm_(optimizer.param_groups[0]["params"], max_norm)``: the parameters of the other groups are
neither counted in the norm nor clipped. An optimizer built on ``model.parameters()`` has one group and looks right.
"""

from __future__ import annotations

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _clip(self, slot: Slot) -> None:
        if self._clip_val is not None:
            clip_gradients(slot.optimizer.param_groups[0]["params"], self._clip_val, self._clip_algorithm)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
