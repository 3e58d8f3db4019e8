"""REENT-001 broken: a ``step()`` called from inside a running ``step()``'s closure is not refused.

It runs its own closure in the middle of the outer one, under the outer call's toggling, and its transaction
overwrites the outer call's: the inner closure runs (and fails on parameters toggled off, or adds to the window of
the call that is still running).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


class ReentryAllowed(Refusals):
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        running, context._call = context._call, None  # no check for a step() that is running
        try:
            super().check_step(context, window, closure, make_optimizer_step, kwargs)
        finally:
            context._call = running


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ReentryAllowed()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
