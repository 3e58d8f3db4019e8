"""ZERO-005 broken: once a window has taken the carried part, the user's ``zero_grad()`` no longer clears it.

Reasoning: ZERO-007 says "once taken it is part of the window", and the implementer's ``zero_grad()`` is the inner
optimizer's, which clears what is on the parameters; the taken part sits beside them, so it survives. This is exactly
Lightning's automatic loop, whose ``zero_grad()`` runs inside the closure, after ``step()`` took the carried part:
every step then applies the last step's gradients again. ZERO-005: until the window's first micro-step has
accumulated, ``zero_grad()`` clears them, taken or not. A ``zero_grad()`` between steps (before the take) still works.
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
    "ZERO-005", ["test_zero_grad_clears_what_the_last_step_left[after a backward took it]"], blind="batch 3"
)


class _ClearsOnlyUntaken(LeaveToUser):
    @override
    def clear(self, window: Window, set_to_none: bool) -> None:
        window.left = None  # what is still on the parameters goes with the inner zero_grad; what was taken stays


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _ClearsOnlyUntaken()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
