"""TXN-001 broken: a real step whose inner step raises is recorded as a skipped step.

The window is put back, but ``last_outcome`` says ``SKIPPED_NON_FINITE``, as if the loss scaler had skipped it: a
loop that reads the outcome then believes the window closed.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import StepCall
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _abort(self, slot: Slot, call: StepCall) -> None:
        super()._abort(slot, call)
        if call.real and call.unscaled_here:  # it reached the inner step
            slot.last_outcome = StepOutcome.SKIPPED_NON_FINITE


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
