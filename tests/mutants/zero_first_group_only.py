"""ZERO-001 broken: after a real step only the first parameter group's gradients are cleared.

The wrapper clears ``optimizer.param_groups[0]["params"]`` itself instead of calling the inner ``zero_grad``: a
second group keeps the stepped window's gradients, which then leak into the next window's sum.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        grads = [(param, param.grad) for group in slot.optimizer.param_groups[1:] for param in group["params"]]
        super()._finish_real_step(slot)
        for param, grad in grads:
            param.grad = grad


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
