"""ZERO-005 broken: a window's first backward (or step) is refused while the last step's gradients are still there.

The reading the contract rejected: gradients a taken real step left on the parameters are treated as if the user had
changed them in place (ZERO-006), so every window that follows a step without ``zero_grad()`` is refused instead of
carrying them.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_a_window_applies_what_it_carries_plus_its_own_mean",
        "test_zero_grad_clears_what_the_last_step_left[with the window open]",
        ORACLE_PROPERTY,
    ],
)


class RefusesLeftGradients(LeaveToUser):
    @override
    def check_take(self, window: Window) -> None:
        left = window.left or {}
        if any(param.grad is not None and param.grad is ref() for param, (ref, _) in left.items()):
            raise RuntimeError(
                "the gradients of the last real step are still there: call opt.zero_grad() before the next window"
            )


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = RefusesLeftGradients()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
