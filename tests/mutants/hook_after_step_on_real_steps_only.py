"""HOOK-003 broken: ``after_step`` runs after real steps only, not after a call that accumulated.

As a framework that counts only optimizer steps: a loop that reads every call's outcome from the hook (to count
micro-steps, or to log each one) never hears of the accumulating ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _step(
        self,
        index: int,
        closure: Callable[[], T] | None,
        make_optimizer_step: bool | None,
        kwargs: dict[str, Any],
        wrapper: Any = None,
    ) -> T | None:
        result = self._run_step(index, closure, make_optimizer_step, kwargs, wrapper)
        outcome = self._slots[index].last_outcome
        if self._hooks.after_step and outcome is not None and outcome is not StepOutcome.ACCUMULATED:
            self._hooks.run_after_step(wrapper or self._new_wrapper(index), outcome)
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
