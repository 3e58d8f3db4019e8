"""CLOS-003 broken: the roll-back of a failed LBFGS step restores a shallow copy of LBFGS's state.

Parameters and gradients are put back, and so is each state entry's dict, but its lists (``old_dirs``,
``old_stps``, ``ro``) and tensors (``prev_flat_grad``) are the ones LBFGS mutates in place: a step that fails after
a few evaluations leaves LBFGS's history extended and its previous gradient overwritten.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.reference.context import _StepRollback
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class _ShallowRollback(_StepRollback):
    def __enter__(self) -> None:
        super().__enter__()
        self._state = {param: dict(entry) for param, entry in self._optimizer.state.items()}


class Context(MutantContext):
    def _closure_evaluating_step(self, index: int, closure: Callable[[], T], kwargs: dict[str, Any]) -> T:
        slot = self._slots[index]

        def evaluate() -> T:
            loss = self._run_closure(index, closure, sync_grad=True)
            self._reduce_gradients(slot)
            self._clip(slot)
            return loss

        step: Callable[..., Any] = slot.optimizer.step
        with _ShallowRollback(slot.optimizer):
            result: T = step(evaluate, **kwargs)
        self._device.after_step()
        self._finish_real_step(slot)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
