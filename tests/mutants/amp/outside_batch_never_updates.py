"""AMP-003 broken: outside any ``batch()`` the loss scaler is never updated; only leaving a ``batch()`` updates it.

An implementation that ties the update to the end of its loop's iteration: a plain loop without ``batch()`` never
ends one, so after an overflow the scale never backs off (every later step skips again at a scale known to be too
large) and it never grows. It is PyTorch's AMP recipe without its ``scaler.update()`` line, the slip in a
hand-written loop that the rationale of AMP-003 names (an overflowing optimizer kept skipping).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.windows import Batch
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("AMP-003", ["test_outside_batch_each_real_step_updates_the_scale", ORACLE_PROPERTY], cells=F16)


class _UpdatesWhenABatchEnds(GradScaling):
    leaving_batch = False

    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        if self.leaving_batch:  # called from a real step outside any batch(): no update there
            super().end_iteration(windows, parallel)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _UpdatesWhenABatchEnds(self.scaler)

    @override
    def batch(self, batch_idx: int, *, is_last: bool = False) -> AbstractContextManager[None]:
        return Batch(self.windows, batch_idx, is_last, self.end_batch_iteration)

    def end_batch_iteration(self) -> None:
        """The end of the iteration a ``batch()`` block leaves: the only one that updates the loss scaler."""
        scaling = self.parts.scaling
        if not isinstance(scaling, _UpdatesWhenABatchEnds):
            self.end_iteration()
            return
        scaling.leaving_batch = True
        try:
            self.end_iteration()
        finally:
            scaling.leaving_batch = False


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
