"""ZERO-005 broken: ``zero_grad(set_to_none=False)`` of a window that took its carried part leaves ``None``, not zeros.

The implementer drops the taken carried part on ``zero_grad()`` whatever ``set_to_none`` says ("zeros carry nothing,
so dropping them is the same"). But the taken gradients were moved off the parameters, so the inner
``zero_grad(set_to_none=False)`` finds ``None`` and leaves ``None`` there, where torch's ``zero_grad(False)`` leaves
zero tensors: a parameter that the window's backward does not reach is then skipped by the optimizer instead of
stepped with a zero gradient (weight decay, momentum, Adam's moments all differ). ZERO-005: ``set_to_none=False``
leaves zeros, which carry nothing; ZERO-002: it clears as the inner optimizer's ``zero_grad(set_to_none)`` does.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-005",
    ["test_zero_grad_clears_what_the_last_step_left[set_to_none=False in step()'s closure]"],
    blind="batch 3",
)


class _DropsCarried(LeaveToUser):
    @override
    def clear(self, window: Window, set_to_none: bool) -> None:
        window.carried, window.left = None, None  # zeros carry nothing: drop it either way


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _DropsCarried()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
