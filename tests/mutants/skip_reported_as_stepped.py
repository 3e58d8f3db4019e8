"""AMP-004 broken: a step that the scaler skipped for non-finite gradients is reported as ``STEPPED``.

The framework reads "the inner step was called" as "the optimizer stepped", as a loop that ignores
``GradScaler``'s found-inf does: ``last_outcome`` and the step count claim a step that never happened.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        skipped = slot.skipped
        super()._finish_real_step(slot)
        if skipped:
            slot.steps += 1
            slot.last_outcome = StepOutcome.STEPPED


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
