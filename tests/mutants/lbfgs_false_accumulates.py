"""CLOS-002 broken: LBFGS with ``make_optimizer_step=False`` is not refused when ``accumulate_grad_batches=1``.

Accumulation is refused where it is configured (``wrap`` with ``accumulate_grad_batches > 1``), but the step only
routes real steps to LBFGS: ``make_optimizer_step=False`` falls through to the first-order path, which runs the
closure once and accumulates its gradients as if LBFGS could take a window's mean.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _check_transition(self, slot: Slot, real: bool, closure: object) -> None:
        if slot.evaluates_closure and not real:
            return  # falls through to the first-order path, which accumulates
        super()._check_transition(slot, real, closure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
