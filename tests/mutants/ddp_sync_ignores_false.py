"""DDP-001 broken: ``make_optimizer_step=False`` on a window boundary of the schedule still all-reduces.

The sync decision is "the user asked to step, or the schedule closes a window here": ``False`` keeps the window
open (no real step) but its closure syncs anyway. Results stay right; the window costs two all-reduces instead
of one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _sync_decision = True

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        real = super()._closes_window(slot, make_optimizer_step)
        self._sync_decision = real or super()._closes_window(slot, None)
        return real

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        return super()._run_closure(index, closure, sync_grad=self._sync_decision)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
