"""REENT-001 broken: a ``step()`` called from inside a running ``step()``'s closure is not refused.

It runs its own closure in the middle of the outer one, under the outer call's toggling, and its transaction
overwrites the outer call's: the inner closure runs (and fails on parameters toggled off, or adds to the window of
the call that is still running).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("REENT-001", ["test_step_inside_a_running_step_is_refused"])

T = TypeVar("T")


class ReentryAllowed(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        windows = context.windows
        running = windows.call
        windows.end_call()  # no check for a step() that is running
        try:
            super().check_step(context, window, closure, make_optimizer_step, kwargs)
        finally:
            windows.call = running  # the running call put back as it was (no public call restores one)
        if running is not None and running.window is window:
            # The re-entered call takes the window as if no call of it were running (the running call's stage is
            # overwritten, as its transaction is): stages are not checked for a step() that is running either.
            window.stage = WindowStage.READY


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ReentryAllowed()

    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        try:
            return super().run_closure(call, index, closure)
        finally:
            # A step() re-entered from the closure left the window at its own end: the running call's stage again.
            stage = WindowStage.CLOSING if call.real else WindowStage.ACCUMULATING
            if call.window.stage is not stage:
                call.window.stage = stage


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
