"""CLOS-003 broken: an accumulating micro-step is counted into the window before its closure runs.

A closure that raises on such a micro-step leaves the window one micro-step longer than the gradients it holds,
so the window closes early and is normalised by the wrong length. Caught by the checks that raise inside an
accumulating micro-step: ``test_closure_that_raises_changes_nothing`` and the generated raising closures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FAULT_PROPERTY, Mutant

MUTANT = Mutant("CLOS-003", ["test_closure_that_raises_changes_nothing", FAULT_PROPERTY])

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        window = call.window
        if call.real:
            return super().run_closure(call, index, closure)
        window.length += 1  # counted before the closure runs, and not taken back when it raises
        result = super().run_closure(call, index, closure)
        window.length -= 1  # the count the accumulation adds once the call returned
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
