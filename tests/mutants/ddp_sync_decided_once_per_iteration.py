"""DDP-001 broken: one sync decision per training iteration, taken by its first ``step()``, for every wrapper.

Like a framework that keeps a single global ``sync_gradients`` flag for all models and optimizers (Accelerate's
``GradientState``): right with one optimizer, but when two optimizers of one iteration have different cadences,
the second's closure runs under the first one's decision. A real step of the second then applies each rank's
unreduced gradients (or a window it keeps open all-reduces in vain).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _iteration_sync: bool | None = None

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        if self._iteration_sync is None:
            self._iteration_sync = sync_grad
        return super()._run_closure(index, closure, sync_grad=self._iteration_sync)

    def _end_iteration(self) -> None:
        self._iteration_sync = None
        super()._end_iteration()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
