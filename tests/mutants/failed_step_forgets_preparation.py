"""TXN-001 broken: a failed call puts the gradients back but leaves the window ready, prepared or not before.

A window that ``unscale_gradients()`` had prepared keeps its prepared gradients after a failed closing step, but not
its stage: ``zero_grad()`` is no longer refused, and the retry averages (and clips) the window a second time.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import StepCall, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _abort(self, slot: Slot, call: StepCall) -> None:
        super()._abort(slot, call)
        slot.stage = WindowStage.READY


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
