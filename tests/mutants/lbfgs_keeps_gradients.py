"""ZERO-001 broken: after an LBFGS step its parameters keep the gradients of the last evaluation.

The first-order path zeroes after its real step; the closure-evaluating path leaves the zeroing to the user's
closure (which zeroes at its start), so the last evaluation's gradients stay on the parameters after ``step``.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        kept = [(param, param.grad) for param in slot.params()] if slot.evaluates_closure else []
        super()._finish_real_step(slot)
        for param, grad in kept:
            param.grad = grad


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
