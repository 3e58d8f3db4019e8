"""ZERO-005 broken: ``zero_grad()`` clears the gradients on the parameters but not a carried part already taken.

After a backward took what the last step left, ``zero_grad(); backward(); step()`` still applies it.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ZERO-005", ["test_zero_grad_clears_what_the_last_step_left[after a backward took it]"])


class KeepsTaken(LeaveToUser):
    @override
    def clear(self, window: Window, set_to_none: bool) -> None:
        window.left = None  # what is still on the parameters goes with zero_grad(); the carried part stays


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = KeepsTaken()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
