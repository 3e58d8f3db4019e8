"""STEP-003 broken: outside ``context.batch`` the schedule follows a count of every ``step()`` call so far.

Accelerate's ``GradientState`` pattern: one step counter for the whole loop, the window closes when it reaches a
multiple of N. With one optimizer stepping only on the schedule it looks right; a window cut short by ``True``, or a
second optimizer's calls, shift every later window.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("STEP-003", [ORACLE_PROPERTY])


class GlobalCounter(Accumulation):
    """One accumulation rule per context: its count is of every micro-step of any optimizer."""

    def __init__(self, every: object, calls: int = 0) -> None:
        super().__init__(every)
        self.calls = calls

    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        self.calls += 1  # every micro-step of any optimizer, counted by the context
        if make_optimizer_step is None and position is None:
            return self.calls % self.accumulate_grad_batches == 0
        return super().closes(make_optimizer_step, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = GlobalCounter(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
