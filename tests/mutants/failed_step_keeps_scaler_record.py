"""TXN-001 broken: a real step whose inner step raises puts the gradients back, but not the loss scaler's record.

The scaler still holds that it unscaled the optimizer in this iteration, so the retry skips the unscaling and the
inner step applies gradients that are still multiplied by the loss scale.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import StepCall
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _abort(self, slot: Slot, call: StepCall) -> None:
        call.rollback()  # the scaler's record of this call's unscale_ stays


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
