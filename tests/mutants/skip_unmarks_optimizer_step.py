"""SCHED-002 broken: a skipped step is hidden from the scheduler by clearing ``_opt_called``.

Meant to keep the schedule in line with the steps really taken; the scheduler's next ``step()`` then warns that
it ran before ``optimizer.step()``, whether it was built on the wrapper or on the inner optimizer.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        skipped = slot.skipped
        super()._finish_real_step(slot)
        if skipped:
            slot.optimizer._opt_called = False  # type: ignore[attr-defined]


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
