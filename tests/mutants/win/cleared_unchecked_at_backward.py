"""WIN-002 broken: a wrapper's ``backward()`` outside ``step()`` does not look for windows cleared from outside.

The cleared-gradients check runs where the window is used, its ``step()`` and ``unscale_gradients()``, and not at a
backward between calls. In the direct form (``opt.backward(loss); opt.step()``) a ``model.zero_grad()`` between two
micro-steps is then never found: the next ``backward()`` writes fresh gradients on the cleared parameters, the
window's step sees gradients everywhere it expects them, and its mean silently misses the cleared micro-steps.

Plausible: a backward "only adds" to the window and does not read it; the spec's "any wrapper's backward() called
outside step()" is the clause that makes it a call that would add to that window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

MUTANT = Mutant(
    "WIN-002",
    [
        "test_gradients_cleared_from_outside_are_refused[module zero_grad()-its own backward()-3-discard]",
        "test_gradients_cleared_from_outside_are_refused[module zero_grad()-its own backward()-3-restore]",
    ],
    blind="batch 5",
)


class StepTimeOnly(OutsideChanges):
    @override
    def check_backward(self, context: TrainingContext) -> None:
        """The defect: a backward between calls checks nothing."""


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.outside = StepTimeOnly()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "WIN-002: a backward() between calls does not find cleared windows")
