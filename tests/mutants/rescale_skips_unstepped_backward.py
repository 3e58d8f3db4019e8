"""AMP-006 broken: a scale change rescales only windows with accumulated micro-steps, not a backward not stepped yet.

The reference until the contract decided AMP-003 outside ``batch()``: the update after a real step rescaled the
windows whose ``pending`` count was positive. Outside any ``batch()``, ``B.backward(lb); A.backward(la); A.step();
B.step()`` with A overflowing halves the scale after A's skipped step; B's gradients, made at the old scale with no
micro-step counted yet, are then unscaled by the new one and B applies twice its gradient (growth: half of it). It is
also what Accelerate's and Fabric's ``optimizer.step()`` (``scaler.step`` then ``scaler.update``) does to the second
optimizer of PyTorch's multi-optimizer AMP recipe, whose backward ran before the first step.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _end_iteration(self) -> None:
        if any(slot.stage is WindowStage.PREPARED for slot in self._slots):
            return
        self._scaling.update(param for slot in self._slots if slot.pending > 0 for param in slot.params())


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
