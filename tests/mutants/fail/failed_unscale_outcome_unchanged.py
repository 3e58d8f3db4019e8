"""FAIL-007 broken: a window discarded by a failed ``unscale_gradients()`` keeps its ``last_outcome``.

The accumulation rule's ``discarded`` empties the window (length 0) but sets ``last_outcome`` to DISCARDED only
when a call was running on the window: between calls it leaves the outcome of the last ``step()``, typically
ACCUMULATED. A framework that reads ``last_outcome`` to learn that the window was lost (to skip the batch, log it,
or not count it) is told the micro-steps are still there.

Plausible: ``last_outcome`` is documented as "what the last ``step()`` call did", and ``unscale_gradients()`` is not
a ``step()``; FAIL-007's "``last_outcome`` ``StepOutcome.DISCARDED``" is easy to read past.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-007",
    [
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-before-unscaling-window-of-1-discard-next-batch]"
    ],
    cells=F16,
    blind="batch 4",
)


class OutcomeOfCallsOnly(Accumulation):
    @override
    def discarded(self, window: Window) -> None:
        window.length = 0
        if window.stage is not WindowStage.READY:  # the defect: only a failed step() call says DISCARDED
            window.last_outcome = StepOutcome.DISCARDED
            window.move(WindowStage.READY)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = OutcomeOfCallsOnly(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a window discarded between calls keeps last_outcome")
