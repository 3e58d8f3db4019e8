"""CLIP-002 broken: ``zero_grad()`` after ``unscale_gradients()`` clears the prepared gradients.

Under 16-mixed the next backward's gradients then reach the step still scaled: the loss scaler unscales an
optimizer once per iteration, so the window cannot be prepared again.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _zero_grad(self, index: int, set_to_none: bool) -> None:
        slot = self._slots[index]
        if slot.pending == 0:
            slot.optimizer.zero_grad(set_to_none=set_to_none)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
