"""DDP-001 broken: the DDP sync decision ignores ``is_last``; the last batch's partial window steps unreduced.

The real step flushes the partial window at the end of the epoch, but the closure's ``no_sync()`` is decided
from ``(batch_idx + 1) % accumulate_grad_batches`` alone, as in loops whose sync flag only counts steps and
misses the end of the dataloader (Accelerate before ``sync_with_dataloader``). The flushed window applies each
rank's own gradients, so the ranks drift apart.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.windows import LoopPosition
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, Mutant

MUTANT = Mutant(
    "DDP-001",
    ["test_closure_form_syncs_once_per_window", "test_closure_form_syncs_each_module_once_per_window"],
    cells=DDP,
)

T = TypeVar("T")


class CountOnlySyncs(Accumulation):
    sync = True
    """The sync decision of the last call: inside ``batch()`` the schedule's count alone decides it."""

    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        real = super().closes(make_optimizer_step, pending, position)
        if make_optimizer_step is None and position is not None:
            self.sync = (position.batch_idx + 1) % self.accumulate_grad_batches == 0
        else:
            self.sync = real
        return real


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._schedule = CountOnlySyncs(self.parts.accumulation.accumulate_grad_batches)
        self.parts.accumulation = self._schedule

    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        parts = self.parts
        watch: AbstractContextManager[None] = (
            parts.scaling.watch(parts.parallel.window_tensors(call.window))
            if parts.scaling.changes_gradients
            else nullcontext()
        )
        with parts.toggling.region(self, index, sync_grad=self._schedule.sync), watch, self.autocast():
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
