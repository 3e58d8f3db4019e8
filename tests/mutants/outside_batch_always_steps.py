"""STEP-003 broken: outside ``context.batch`` the schedule is unknown, so ``make_optimizer_step=None`` steps.

An implementation that only accumulates when the loop tells it where it is: plain loops never accumulate.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        if make_optimizer_step is None and self._position is None:
            return True
        return super()._closes_window(slot, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
