"""CLIP-001 broken: a closure-evaluating optimizer (LBFGS) never sees clipped gradients.

Clipping sits in the first-order path, right before the inner step; LBFGS computes its gradients inside its own
``step`` and uses them unclipped (the behaviour of this project's reference before contract 2026.12, and of
wrappers that clip before ``optimizer.step(closure)``).
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
            loss = self._run_closure(index, closure, sync_grad=True)
            self._reduce_gradients(slot)
            return loss

        step: Callable[..., Any] = slot.optimizer.step
        with _StepRollback(slot.optimizer):
            result: T = step(evaluate, **kwargs)
        self._device.after_step()
        self._finish_real_step(slot)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
