"""SCHED-002 broken: a skipped step is not counted for the scheduler when another optimizer's window is open.

SCHED-001 says an iteration that only accumulated must keep torch's "scheduler before optimizer" warning, and
SCHED-002 says a skipped real step must not raise it. The implementer tells the two apart by whether the context
still holds an open window, which is right with one optimizer; with two, an optimizer whose step was skipped
while another only accumulated in the same iteration gets its scheduler warning back.
"""

from __future__ import annotations

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.reference.windows import Windows
from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.types import StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "SCHED-002",
    ["test_a_skipped_step_beside_an_accumulating_window_warns_as_torch[accumulate first-inner optimizer]"],
    cells=F16,
    blind="batch 1",
)


class _IterationAccumulation(Accumulation):
    __slots__ = ("windows",)

    def __init__(self, every: object, windows: Windows) -> None:
        super().__init__(every)
        self.windows = windows

    @override
    def closed(self, window: Window, *, skipped: bool) -> None:
        if skipped and any(other.length for other in self.windows if other is not window):
            # the iteration is still accumulating: leave torch's warning alone (SCHED-001)
            window.last_outcome = StepOutcome.SKIPPED_NON_FINITE
            window.optimizer.zero_grad(set_to_none=True)
            window.length = 0
            window.move(WindowStage.READY)
            return
        super().closed(window, skipped=skipped)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.accumulation = _IterationAccumulation(self.parts.accumulation.accumulate_grad_batches, self.windows)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
