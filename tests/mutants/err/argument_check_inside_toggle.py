"""ERR-001 broken: the step toggles the model before it checks its arguments, and a refused call stays toggled.

Lightning's ``toggle_optimizer()`` / ``untoggle_optimizer()`` pattern (two calls, not a context manager) around the
step body, with the argument checks between them: a ``TypeError`` for a bad closure or ``make_optimizer_step`` skips
the untoggle, so with two optimizers the other one's parameters are left with ``requires_grad=False``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-001", ["test_bad_arguments_leave_both_windows"])


class ToggledRefusals(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        index = next(i for i, each in enumerate(context.windows) if each is window)
        toggle = context.parts.toggling.region(context, index, sync_grad=True)
        toggle.__enter__()  # toggle_optimizer()
        super().check_step(context, window, closure, make_optimizer_step, kwargs)
        toggle.__exit__(None, None, None)  # untoggle_optimizer()


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ToggledRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
