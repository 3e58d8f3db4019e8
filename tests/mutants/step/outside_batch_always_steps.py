"""STEP-003 broken: outside ``context.batch`` the schedule is unknown, so ``make_optimizer_step=None`` steps.

An implementation that only accumulates when the loop tells it where it is: plain loops never accumulate.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-003", ["test_schedule_outside_a_batch_counts_micro_steps"])


class StepsOutsideBatch(Accumulation):
    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        if make_optimizer_step is None and position is None:
            return True
        return super().closes(make_optimizer_step, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = StepsOutsideBatch(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
