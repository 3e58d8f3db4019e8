"""STEP-003 broken: ``make_optimizer_step=None`` steps on every call inside a batch, ignoring accumulation.

As a loop that reads ``accumulate_grad_batches`` only outside the training loop: every micro-step is a real
step on its own gradient, and nothing accumulates.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        if make_optimizer_step is None and self._position is not None:
            return True
        return super()._closes_window(slot, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
