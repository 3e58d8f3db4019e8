"""FAIL-007 broken: a window discarded by a failed ``unscale_gradients()`` keeps its length (and ``last_outcome``).

The accumulation rule's ``discarded`` resets a window only when it finds a call running on it (the window in
stage ACCUMULATING or CLOSING); a window discarded between calls is READY, so it returns early. The gradients are
gone (the policy's transaction cleared them) but the window still counts its micro-steps: the next window closes
early on the schedule (``make_optimizer_step=None``) and its mean is divided by micro-steps that are not in it, and
``last_outcome`` still says ACCUMULATED.

Plausible: until FAIL-007 a window was only ever discarded from inside a failed ``step()``, and a guard "no call,
nothing to discard" is the natural way to keep the stage transition (READY to READY is not a transition) legal.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
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


class CallOnlyDiscard(Accumulation):
    @override
    def discarded(self, window: Window) -> None:
        if window.stage is WindowStage.READY:
            return  # the defect: no call was running, so nothing is reset
        super().discarded(window)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = CallOnlyDiscard(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a window discarded between calls keeps its length")
