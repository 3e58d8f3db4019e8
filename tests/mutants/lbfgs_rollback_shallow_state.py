"""CLOS-003 broken: the roll-back of a failed LBFGS step restores a shallow copy of LBFGS's state.

Parameters and gradients are put back, and so is each state entry's dict, but its lists (``old_dirs``,
``old_stps``, ``ro``) and tensors (``prev_flat_grad``) are the ones LBFGS mutates in place: a step that fails after
a few evaluations leaves LBFGS's history extended and its previous gradient overwritten.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from lightning_optimizer.reference.context import _StepRollback
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class _ShallowRollback(_StepRollback):
    def __enter__(self) -> None:
        super().__enter__()
        self._state = {param: dict(entry) for param, entry in self._optimizer.state.items()}


class Context(MutantContext):
    def _step_rollback(self, slot: Slot) -> AbstractContextManager[None]:
        return _ShallowRollback(slot.optimizer)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
