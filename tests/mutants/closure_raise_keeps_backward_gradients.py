"""CLOS-003 broken: a closure that raises after its backward leaves that backward's gradients in the window.

The next real step then applies the failed micro-batch's gradients too (the reference before this rule was checked).
"""

from __future__ import annotations

from lightning_optimizer.reference.window import StepCall
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _abort(self, slot: Slot, call: StepCall) -> None:
        call.merge()  # the raising closure's backward stays in the window
        slot.stage = call.stage_before


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
