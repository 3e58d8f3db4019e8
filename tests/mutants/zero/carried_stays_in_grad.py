"""ZERO-005 broken: the carried gradients stay in ``.grad`` and the window accumulates onto them.

The natural implementation of "leave the gradients to the user's ``zero_grad()``": a taken real step simply does not
clear, and the next window's backwards accumulate onto what it left, exactly as a plain PyTorch loop without
``zero_grad()`` does. The window's preparation then treats the sum as the window's own: the mean divides the carried
part by the window's length and 16-mixed unscales it a second time. With ``accumulate_grad_batches=1`` in a true
precision this is exact (``(c + g) / 1``), which is what a casual test of the setting runs. ZERO-005 says the closing
step applies ``c + (g_1 + ... + g_k) / k``: the carried part is not divided by the window's length and not unscaled
again.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser, Taking
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-005", ["test_a_window_applies_what_it_carries_plus_its_own_mean[windows 2, 4, flushed 1]"], blind="batch 3"
)


class _AccumulateOntoLeft(LeaveToUser):
    @override
    def take(self, window: Window) -> Taking | None:
        left = window.left
        if left is None:
            return None
        self.check_take(window)
        taking = Taking(left, window.carried)
        window.left = None  # taken: the window simply goes on from the gradients the step left on the parameters
        return taking

    @override
    def untake(self, window: Window, taking: Taking) -> None:
        window.left = taking.left
        window.carried = taking.carried


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _AccumulateOntoLeft()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
