"""STEP-004 broken: an LBFGS step does not record its outcome; ``last_outcome`` keeps what it was (``None``).

The closure-evaluating path returns LBFGS's result straight after its step and never sets the outcome that the
first-order path sets, so a user (or a framework's logging) reads ``None`` after every LBFGS step.
"""

from __future__ import annotations

from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        before = slot.last_outcome
        super()._finish_real_step(slot)
        if slot.evaluates_closure:
            slot.last_outcome = before


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
