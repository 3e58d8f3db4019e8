"""TXN-001 broken: a real step whose inner step raises leaves the window as its preparation made it.

The transaction covers the closure only: once the window was averaged, unscaled and clipped for the inner step, a
failure there keeps those gradients (and the failed call's closure's), so a retry averages and unscales them again.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import StepCall
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _abort(self, slot: Slot, call: StepCall) -> None:
        if call.unscaled_here:  # the preparation ran in this call: its gradients are kept
            slot.stage = call.stage_before
            slot.skipped = False
            self._scaling.forget(slot.optimizer)
            return
        super()._abort(slot, call)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
