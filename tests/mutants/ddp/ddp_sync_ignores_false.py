"""DDP-001 broken: ``make_optimizer_step=False`` on a window boundary of the schedule still all-reduces.

The sync decision is "the user asked to step, or the schedule closes a window here": ``False`` keeps the window
open (no real step) but its closure syncs anyway. Results stay right; the window costs two all-reduces instead
of one.
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


class StepOrScheduleSyncs(Accumulation):
    sync = True
    """The sync decision of the last call: it closes the window, or the schedule would have closed it."""

    @override
    def closes(self, make_optimizer_step: bool | None, pending: int, position: LoopPosition | None) -> bool:
        real = super().closes(make_optimizer_step, pending, position)
        self.sync = real or super().closes(None, pending, position)
        return real


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._schedule = StepOrScheduleSyncs(self.parts.accumulation.accumulate_grad_batches)
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
