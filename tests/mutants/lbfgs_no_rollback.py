"""CLOS-003 broken: an LBFGS step whose closure raises leaves LBFGS's state, gradients and parameters behind.

The behaviour of this project's reference before contract 2026.12, and of every wrapper that calls
``optimizer.step(closure)`` bare: an evaluation that raises after its backward leaves its gradients, one that raises
after LBFGS moved the parameters leaves them moved and LBFGS's history extended.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _step_rollback(self, slot: Slot) -> AbstractContextManager[None]:
        return nullcontext()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
