"""AMP-006 broken: a scale change rescales only windows with accumulated micro-steps, not a backward not stepped yet.

The reference until the contract decided AMP-003 outside ``batch()``: the update after a real step rescaled the
windows whose ``pending`` count was positive. Outside any ``batch()``, ``B.backward(lb); A.backward(la); A.step();
B.step()`` with A overflowing halves the scale after A's skipped step; B's gradients, made at the old scale with no
micro-step counted yet, are then unscaled by the new one and B applies twice its gradient (growth: half of it). It is
also what Accelerate's and Fabric's ``optimizer.step()`` (``scaler.step`` then ``scaler.update``) does to the second
optimizer of PyTorch's multi-optimizer AMP recipe, whose backward ran before the first step.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-006",
    [
        "test_outside_batch_each_real_step_updates_the_scale[backward-all-then-step]",
        "test_outside_batch_each_real_step_updates_the_scale[prepared-while-another-steps]",
    ],
    cells=F16,
)


class _RescalesAccumulatedWindowsOnly(GradScaling):
    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        if any(window.stage is WindowStage.PREPARED for window in windows):
            return
        self.update(param for window in windows if window.length > 0 for param in window.params())


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _RescalesAccumulatedWindowsOnly(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
