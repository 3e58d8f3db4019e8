"""CLOS-003 broken: an accumulating micro-step is counted into the window before its closure runs.

A closure that raises on such a micro-step leaves the window one micro-step longer than the gradients it holds,
so the window closes early and is normalised by the wrong length. Caught by the checks that raise inside an
accumulating micro-step: ``test_closure_that_raises_changes_nothing`` and the generated raising closures.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        self._check_step_arguments(closure, make_optimizer_step)
        slot = self._slots[index]
        if slot.evaluates_closure or self._closes_window(slot, make_optimizer_step):
            return super()._step(index, closure, make_optimizer_step, kwargs)
        slot.pending += 1
        result = None if closure is None else self._run_closure(index, closure)
        slot.last_outcome = StepOutcome.ACCUMULATED
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
