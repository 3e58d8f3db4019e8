"""ZERO-005 broken (with CLIP-001): the carried part is added after clipping, so it is never clipped with the window.

Reasoning: the carried gradients were clipped already at the step that applied them; clipping them again "would
clip twice", so the implementer clips the window's new mean and then adds the carried part. ZERO-005: the carried
part "is clipped with the rest, since CLIP-001 clips what the step applies". Invisible without clipping and without
``zero_grad_after_step=False``.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import AddCarried, Preparation
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_a_taken_step_leaves_the_gradients_it_applied[user-zero-grad]",
        "test_configured_clipping_clips_the_carried_part_with_the_rest[norm]",
    ],
    blind="batch 3",
)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        old = self.parts.preparation
        steps = (*(step for step in old.steps if not isinstance(step, AddCarried)), AddCarried())
        self.parts.preparation = Preparation(steps=steps, evaluation=old.evaluation)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
