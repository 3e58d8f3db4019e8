"""AMP-003 broken: the update after a real step runs even while another window is prepared by ``unscale_gradients()``.

The reference until the contract decided AMP-003 outside ``batch()``: ``A.backward(la); B.backward(lb);
B.unscale_gradients(); A.step(); B.step()`` updated the scaler after A's step, which wipes ``GradScaler``'s record
that B was unscaled (``update()`` resets its per-optimizer states): B's step unscales its already unscaled mean a
second time, and a scale change in between also multiplies the prepared (unscaled) gradients by new / old. It is what
an ``optimizer.step()`` that calls ``scaler.update()`` right after ``scaler.step()`` (Accelerate's, Fabric's) does to
another optimizer that the user unscaled first to clip it (``accelerator.clip_grad_norm_``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-003", ["test_outside_batch_each_real_step_updates_the_scale[prepared-while-another-steps]"], cells=F16
)


class _UpdatesWhilePrepared(GradScaling):
    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        self.update(param for window in windows for param in window.params())


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _UpdatesWhilePrepared(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
