"""DDP-001 broken: the DDP sync decision follows the accumulation schedule, whatever ``make_optimizer_step`` says.

The real step honours ``make_optimizer_step``, but the closure runs under ``no_sync()`` unless the loop position
completes a window, as when a training loop decides ``no_sync()`` from its own schedule before calling the
user's step (Lightning's loop-driven ``_block_parallel_sync_behavior``). A window cut short by ``True`` steps on
each rank's unreduced gradients, so the ranks drift apart; a ``False`` on a window boundary all-reduces in vain.
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
        self._sync_decision = super()._closes_window(slot, None)
        return super()._closes_window(slot, make_optimizer_step)

    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        return super()._run_closure(index, closure, sync_grad=self._sync_decision)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
