"""HOOK-003 broken: ``after_step`` runs after real steps only, not after a call that accumulated.

As a framework that counts only optimizer steps: a loop that reads every call's outcome from the hook (to count
micro-steps, or to log each one) never hears of the accumulating ones.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _after_step(self, index: int, wrapper: Any) -> None:
        if self._slots[index].last_outcome is not StepOutcome.ACCUMULATED:
            super()._after_step(index, wrapper)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
