"""CLOS-003 broken: a closure that raises after its backward leaves that backward's gradients in the window.

The next real step then applies the failed micro-batch's gradients too (the reference before this rule was checked).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure_keeping_window(self, index: int, closure: Callable[[], T], real: bool) -> T:
        slot = self._slots[index]
        slot.accumulating = not real
        try:
            return self._run_closure(index, closure, sync_grad=real)
        finally:
            slot.accumulating = False


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
