"""ZERO-001 broken: a real step leaves the window's gradients in ``.grad`` (the user must call ``zero_grad``)."""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        slot.pending = 0
        slot.steps += 1
        slot.last_outcome = StepOutcome.STEPPED


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
