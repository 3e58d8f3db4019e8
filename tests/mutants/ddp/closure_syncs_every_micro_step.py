"""DDP-001 broken: a closure never runs under ``no_sync()``; every micro-step all-reduces its gradients.

Correct results at ``accumulate_grad_batches`` times the communication: the accumulation window does not
suppress DDP's gradient sync, as in loops that forget ``model.no_sync()``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, Mutant

MUTANT = Mutant("DDP-001", ["test_closure_form_syncs_once_per_window"], cells=DDP)

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        parts = self.parts
        watch: AbstractContextManager[None] = (
            parts.scaling.watch(parts.parallel.window_tensors(call.window))
            if parts.scaling.changes_gradients
            else nullcontext()
        )
        with parts.toggling.region(self, index, sync_grad=True), watch, self.autocast():  # synced, real or not
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
