"""TOGGLE-001 broken: the evaluations of a closure-evaluating optimizer (LBFGS) are not toggled.

The first-order path toggles around the closure, but the LBFGS path hands LBFGS a closure that only enters the
autocast region: inside every evaluation the other optimizers' parameters still require grad, so LBFGS's
backward passes write into their gradients (an open window of another optimizer included).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.reference.context import _StepRollback
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _closure_evaluating_step(self, index: int, closure: Callable[[], T], kwargs: dict[str, Any]) -> T:
        slot = self._slots[index]

        def evaluate() -> T:
            with self.autocast():
                loss = closure()
            self._reduce_gradients(slot)
            self._clip(slot)
            return loss

        step: Callable[..., Any] = slot.optimizer.step
        with _StepRollback(slot.optimizer):
            result: T = step(evaluate, **kwargs)
        self._device.after_step()
        self._finish_real_step(slot)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
