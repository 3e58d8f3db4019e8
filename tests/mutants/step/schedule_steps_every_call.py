"""STEP-003 broken: ``make_optimizer_step=None`` steps on every call inside a batch, ignoring accumulation.

As a loop that reads ``accumulate_grad_batches`` only outside the training loop: every micro-step is a real
step on its own gradient, and nothing accumulates.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("STEP-003", ["test_schedule_flushes_last_partial_window", ORACLE_PROPERTY])


class StepsEveryCallInBatch(Accumulation):
    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        if make_optimizer_step is None and position is not None:
            return True
        return super().closes(make_optimizer_step, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = StepsEveryCallInBatch(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
