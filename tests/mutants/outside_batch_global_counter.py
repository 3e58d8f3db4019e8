"""STEP-003 broken: outside ``context.batch`` the schedule follows a count of every ``step()`` call so far.

Accelerate's ``GradientState`` pattern: one step counter for the whole loop, the window closes when it reaches a
multiple of N. With one optimizer stepping only on the schedule it looks right; a window cut short by ``True``, or a
second optimizer's calls, shift every later window.
"""

from __future__ import annotations

from typing import TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    calls: int = 0

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        self.calls += 1  # every micro-step of any optimizer, counted by the context
        if make_optimizer_step is None and self._position is None:
            return self.calls % self._accumulate_grad_batches == 0
        return super()._closes_window(slot, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
