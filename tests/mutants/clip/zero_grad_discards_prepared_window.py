"""CLIP-002 broken: ``zero_grad()`` after ``unscale_gradients()`` clears the prepared gradients.

Under 16-mixed the next backward's gradients then reach the step still scaled: the loss scaler unscales an
optimizer once per iteration, so the window cannot be prepared again.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-002", ["test_manual_clip_after_unscale_gradients"])


class ZeroGradOfPreparedWindowAllowed(Refusals):
    @override
    def check_zero_grad(self, context: TrainingContext, window: Window) -> None:
        pass  # a prepared window is cleared like any empty one


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ZeroGradOfPreparedWindowAllowed()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
