"""ZERO-006 broken: a gradient that replaced the one the step left (after ``model.zero_grad()``) is carried.

The implementer remembers *which parameters* the last step left gradients on, not *which tensors*: at the window's
start, whatever gradient those parameters hold is taken as the carried part (and the in-place check is made only when
it is still the same tensor, so nothing is refused). After ``model.zero_grad()`` (set to ``None``) and a plain
``loss.backward()`` before the first ``step()``, that new gradient is a micro-step of the window, yet it is carried:
added whole instead of averaged with the window. ZERO-006: gradients that were replaced or set to ``None`` outside
the wrapper carry nothing.
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
    "ZERO-006",
    ["test_a_gradient_written_after_the_left_one_was_cleared_is_the_windows_own[model.zero_grad()]"],
    blind="batch 3",
)


class _TakesByParameter(LeaveToUser):
    @override
    def take(self, window: Window) -> Taking | None:
        left = window.left
        if left is None:
            return None
        self.check_take(window)  # the reference's check: only where the tensor is still the one the step left
        taking = Taking(left, window.carried)
        carried = dict(window.carried or {})
        for param in left:
            grad = param.grad
            if grad is not None:  # the parameter had a gradient left on it: take what it holds now
                carried[param] = grad if grad._base is None else grad.clone()
                param.grad = None
        window.left = None
        window.carried = carried or None
        return taking


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _TakesByParameter()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
