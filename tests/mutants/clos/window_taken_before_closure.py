"""CLOS-003 broken: a real step takes (and resets) the window before its closure runs.

Correct while closures succeed; a closure that raises leaves the window counted as closed, so the micro-steps
already accumulated are mixed into a later window that is normalised by the wrong length. The window is taken
where the call's transition is checked, once it is known to close the window; its mean divides by the length taken.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FAULT_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CLOS-003", ["test_closure_that_raises_changes_nothing[restore]", FAULT_PROPERTY])


class TakesTheWindow(Refusals):
    def __init__(self, taken: dict[int, int]) -> None:
        self.taken = taken

    @override
    def check_transition(self, window: Window, real: bool, closure: object) -> None:
        super().check_transition(window, real, closure)
        if real:
            self.taken[id(window)] = window.length + 1
            window.length = 0


class TakenWindowMean(WindowMean):
    def __init__(self, taken: dict[int, int]) -> None:
        self.taken = taken

    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return True

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        divisor = context.parts.scaling.window_divisor(context.accumulate_grad_batches)
        normalise_window(window.params(), self.taken.pop(id(window), window.length + 1), divided_by=divisor)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        taken: dict[int, int] = {}
        self.parts.refusals = TakesTheWindow(taken)
        preparation = self.parts.preparation
        steps = tuple(TakenWindowMean(taken) if isinstance(step, WindowMean) else step for step in preparation.steps)
        self.parts.preparation = dataclasses.replace(preparation, steps=steps)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
