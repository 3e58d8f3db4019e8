"""FAIL-003 broken: a discarded window loses its gradients but keeps its length.

The framework reads the window's length as the loop's position in the accumulation schedule ("the micro-steps
happened, only their gradients are gone") and leaves it when it discards. The next call then continues a window
that holds nothing: outside ``batch()`` it closes early, and its real step divides the gradients it does have by
a length that counts the discarded micro-steps, so the mean it applies is too small.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-003",
    [
        "test_a_discarded_window_is_gone_and_the_next_is_exact[plain-backward-cut-short]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[hook-flushed]",
        "test_closure_that_raises_changes_nothing[discard]",
    ],
    blind="contract 2026.12.6",
)


class LengthKeepingAccumulation(Accumulation):
    @override
    def discarded(self, window: Window) -> None:
        window.last_outcome = StepOutcome.DISCARDED
        window.stage = WindowStage.READY  # ``pending`` kept: the schedule's position


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = LengthKeepingAccumulation(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
