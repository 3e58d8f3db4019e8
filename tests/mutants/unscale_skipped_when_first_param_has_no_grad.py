"""AMP-002 broken: whether a window has gradients to unscale is judged by the optimizer's first parameter.

``if params[0].grad is not None: scaler.unscale_(optimizer)``: an optimizer whose first parameter got no gradient
(an embedding the batch did not use, a frozen layer, a parameter listed first but unused) steps on gradients still
multiplied by the loss scale.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _unscale(self, slot: Slot) -> None:
        if slot.params()[0].grad is not None:
            super()._unscale(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
