"""WIN-002 broken: an open window counts as cleared from outside only when every one of its gradients is gone.

The check reads "the window's gradients were cleared" as the whole window: it raises when no parameter that held part
of the window holds a gradient any more (``model.zero_grad()``, the inner optimizer's ``zero_grad()``), and lets a
partial clearing through (``p.grad = None`` on one parameter, ``zero_grad()`` of a submodule that shares the optimizer).
That parameter's accumulated micro-steps are lost while the window's length still counts them, and the real step
applies a mean over what came after.

Plausible: the examples the spec gives first clear everything, and "were the gradients cleared?" is easily written as
``all(p.grad is None ...)``; "a parameter of the window that had a gradient ... and has none now" is the exact rule.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "WIN-002",
    [
        "test_gradients_cleared_from_outside_are_refused[a gradient set to None-another wrapper's "
        "backward()-2-discard]",
        "test_gradients_cleared_from_outside_are_refused[a gradient set to None-another wrapper's "
        "backward()-2-restore]",
        "test_gradients_cleared_from_outside_are_refused[a gradient set to None-step()-3-discard]",
        "test_gradients_cleared_from_outside_are_refused[a gradient set to None-step()-3-restore]",
        "test_gradients_cleared_from_outside_are_refused[a gradient set to None-step(closure)-2-discard]",
        "test_gradients_cleared_from_outside_are_refused[a gradient set to None-step(closure)-2-restore]",
    ],
    blind="batch 5",
)


class WholeWindowCleared(OutsideChanges):
    @override
    def check_cleared(self, window: Window) -> None:
        if window.holding and all(param.grad is None for param in window.holding):  # the defect: all, not any
            super().check_cleared(window)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = WholeWindowCleared()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-002: a window counts as cleared only when all its gradients are gone")
