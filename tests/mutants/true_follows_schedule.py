"""STEP-001 broken: ``make_optimizer_step=True`` is ignored and the accumulation schedule decides.

Like a framework that only reads the flag to *skip* steps: an explicit request to step now waits for the window.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        return super()._closes_window(slot, None if make_optimizer_step is True else make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
