"""STEP-003 broken: outside ``context.batch`` the schedule follows a count of every ``step()`` call so far.

Accelerate's ``GradientState`` pattern: one step counter for the whole loop, the window closes when it reaches a
multiple of N. With one optimizer stepping only on the schedule it looks right; a window cut short by ``True``, or a
second optimizer's calls, shift every later window.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    calls: int = 0

    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        result = super()._step(index, closure, make_optimizer_step, kwargs)
        self.calls += 1
        return result

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        if make_optimizer_step is None and self._position is None:
            return (self.calls + 1) % self._accumulate_grad_batches == 0
        return super()._closes_window(slot, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
