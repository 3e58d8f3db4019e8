"""ZERO-004 broken (16-mixed): a real step skipped for non-finite gradients leaves them too, to be carried.

Reading ``zero_grad_after_step=False`` as "the wrapper never clears gradients, ``zero_grad()`` is the user's": the
after-step rule does not look at whether the step was taken. ZERO-004's second sentence: a skipped step sets them to
``None`` all the same (ZERO-001), because carried infinities would make every later step skip. A loop that calls
``zero_grad()`` at every window's start (Lightning's) hides it; one that leaves the gradients does not.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "ZERO-004",
    [
        "test_a_taken_step_leaves_the_gradients_it_applied[user-zero-grad]",
        "test_the_carried_part_is_neither_unscaled_nor_rescaled_again[closure]",
    ],
    cells=F16,
    blind="batch 3",
)


class _NeverClears(LeaveToUser):
    @override
    def after_step(self, window: Window, *, skipped: bool) -> None:
        super().after_step(window, skipped=False)  # taken or skipped: the user clears


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _NeverClears()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
