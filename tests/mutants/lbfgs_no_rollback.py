"""CLOS-003 broken: an LBFGS step whose closure raises leaves LBFGS's state, gradients and parameters behind.

The behaviour of this project's reference before contract 2026.12, and of every wrapper that calls
``optimizer.step(closure)`` bare: an evaluation that raises after its backward leaves its gradients, one that raises
after LBFGS moved the parameters leaves them moved and LBFGS's history extended.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
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
        result: T = step(evaluate, **kwargs)
        self._device.after_step()
        self._finish_real_step(slot)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
