"""CLOS-003 broken: an accumulating micro-step is counted into the window before its closure runs.

A closure that raises on such a micro-step leaves the window one micro-step longer than the gradients it holds,
so the window closes early and is normalised by the wrong length. Caught by the checks that raise inside an
accumulating micro-step: ``test_closure_that_raises_changes_nothing`` and the generated raising closures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _run_closure(self, index: int, closure: Callable[[], T], sync_grad: bool = True) -> T:
        slot = self._slots[index]
        if sync_grad:
            return super()._run_closure(index, closure, sync_grad)
        slot.pending += 1  # counted before the closure runs, and not taken back when it raises
        result = super()._run_closure(index, closure, sync_grad)
        slot.pending -= 1  # the count the accumulation adds once the closure returned
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
