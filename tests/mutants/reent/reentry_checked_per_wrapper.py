"""REENT-001 broken: only a wrapper's own running ``step()`` refuses a re-entered call; another wrapper's step runs.

A per-wrapper "busy" flag instead of one for the context: from inside one wrapper's closure, the other wrapper's
``step()`` runs its closure under the first wrapper's toggling and transaction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.windows import Windows
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "REENT-001",
    [
        "test_step_inside_a_running_step_is_refused[discard-other]",
        "test_step_inside_a_running_step_is_refused[restore-other]",
    ],
)


class ReentryPerWrapper(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        running = context.windows.call
        if running is None or running.window is window:
            super().check_step(context, window, closure, make_optimizer_step, kwargs)
            return
        # Another wrapper's step is running: not this one's business. The other checks see no step running.
        super().check_step(cast("TrainingContext", _NoStepRunning()), window, closure, make_optimizer_step, kwargs)


class _NoStepRunning:
    """All that ``Refusals.check_step`` reads of a context: its windows, here with no ``step()`` running."""

    def __init__(self) -> None:
        self.windows = Windows()


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ReentryPerWrapper()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
