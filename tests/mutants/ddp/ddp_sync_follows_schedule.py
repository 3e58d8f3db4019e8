"""DDP-001 broken: the DDP sync decision follows the accumulation schedule, whatever ``make_optimizer_step`` says.

The real step honours ``make_optimizer_step``, but the closure runs under ``no_sync()`` unless the loop position
completes a window, as when a training loop decides ``no_sync()`` from its own schedule before calling the
user's step (Lightning's loop-driven ``_block_parallel_sync_behavior``). A window cut short by ``True`` steps on
each rank's unreduced gradients, so the ranks drift apart; a ``False`` on a window boundary all-reduces in vain.
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


class ScheduleDecidesSync(Accumulation):
    sync = True
    """The sync decision of the last call: the schedule's, ``make_optimizer_step`` left out."""

    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        self.sync = super().closes(None, pending, position)
        return super().closes(make_optimizer_step, pending, position)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._schedule = ScheduleDecidesSync(self.parts.accumulation.accumulate_grad_batches)
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
