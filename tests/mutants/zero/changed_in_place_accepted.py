"""ZERO-006 broken: gradients left by a step and changed in place before the window takes them are taken silently.

Reasoning: tracking autograd's version counters "is overkill"; whatever the parameters hold when the window starts is
what the last step left, so the implementer takes it as the carried part. A ``loss.backward()`` before a closure-less
``step()`` (or an in-place ``zero_grad(set_to_none=False)`` of the module) is then folded into the carried part: not
divided by the window's length, not unscaled. ZERO-006: the ``step()`` or ``backward()`` that would take such
gradients raises ``RuntimeError`` naming ``opt.zero_grad()`` and changes nothing.
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
    "ZERO-006",
    [
        "test_gradients_changed_in_place_before_they_were_taken_are_refused[loss.backward() before step()-discard]",
        "test_gradients_changed_in_place_before_they_were_taken_are_refused[loss.backward() before step()-restore]",
    ],
    blind="batch 3",
)


class _NoVersionCheck(LeaveToUser):
    @override
    def check_take(self, window: Window) -> None:
        """Whatever is on the parameters now is what the last step left."""


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _NoVersionCheck()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
