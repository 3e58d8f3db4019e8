"""STEP-002 broken: ``make_optimizer_step=False`` does not hold the step back when the schedule would step.

The truthiness slip ``make_optimizer_step or schedule_says_step``: ``False`` falls through to the schedule.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-002", ["test_false_accumulates_only", "test_gan_cadences"])


class FalseFallsThrough(Accumulation):
    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        return bool(make_optimizer_step) or super().closes(None, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = FalseFallsThrough(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
