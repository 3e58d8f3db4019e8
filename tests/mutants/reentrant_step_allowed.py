"""REENT-001 broken: a ``step()`` called from inside a running ``step()``'s closure is not refused.

It runs its own closure in the middle of the outer one, under the outer call's toggling, and its transaction
overwrites the outer call's: the inner closure runs (and fails on parameters toggled off, or adds to the window of
the call that is still running).
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        running, self._call = self._call, None  # no check for a step() that is running
        try:
            super()._check_step_arguments(index, closure, make_optimizer_step, kwargs)
        finally:
            self._call = running


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
