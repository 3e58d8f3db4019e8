"""STEP-001 broken: ``make_optimizer_step=True`` is ignored and the accumulation schedule decides.

Like a framework that only reads the flag to *skip* steps: an explicit request to step now waits for the window.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-001", ["test_true_steps_now", "test_window_cut_short_applies_its_own_mean"])


class TrueFollowsSchedule(Accumulation):
    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        return super().closes(None if make_optimizer_step is True else make_optimizer_step, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = TrueFollowsSchedule(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
