"""ZERO-001 broken: after an LBFGS step its parameters keep the gradients of the last evaluation.

The first-order path zeroes after its real step; the closure-evaluating path leaves the zeroing to the user's
closure (which zeroes at its start), so the last evaluation's gradients stay on the parameters after ``step``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.reference.context import _StepRollback
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _closure_evaluating_step(self, index: int, closure: Callable[[], T], kwargs: dict[str, Any]) -> T:
        slot = self._slots[index]

        def evaluate() -> T:
            loss = self._run_closure(index, closure, sync_grad=True)
            self._reduce_gradients(slot)
            self._clip(slot)
            return loss

        step: Callable[..., Any] = slot.optimizer.step
        with _StepRollback(slot.optimizer):
            result: T = step(evaluate, **kwargs)
        self._device.after_step()
        slot.steps += 1
        slot.last_outcome = StepOutcome.STEPPED
        slot.pending = 0
        if self._position is None:
            self._end_iteration()
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
