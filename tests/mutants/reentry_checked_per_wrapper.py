"""REENT-001 broken: only a wrapper's own running ``step()`` refuses a re-entered call; another wrapper's step runs.

A per-wrapper "busy" flag instead of one for the context: from inside one wrapper's closure, the other wrapper's
``step()`` runs its closure under the first wrapper's toggling and transaction.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        running = self._call
        if running is None or running.window is self._slots[index]:
            super()._check_step_arguments(index, closure, make_optimizer_step, kwargs)
            return
        self._call = None  # another wrapper's step is running: not this one's business
        try:
            super()._check_step_arguments(index, closure, make_optimizer_step, kwargs)
        finally:
            self._call = running


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
