"""STEP-002 broken: ``make_optimizer_step=False`` does not hold the step back when the schedule would step.

The truthiness slip ``make_optimizer_step or schedule_says_step``: ``False`` falls through to the schedule.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        return bool(make_optimizer_step) or super()._closes_window(slot, None)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
