"""ZERO-005 broken: ``unscale_gradients()`` makes the window's mean alone, and the closing step adds nothing more.

The user's clip after ``unscale_gradients()`` sees the mean without the carried part, and the step applies no
carried part at all: the preparation that ``unscale_gradients()`` runs early leaves it out.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import AddCarried, Preparation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ZERO-005", ["test_unscale_gradients_makes_the_sum_the_user_clips[backward]"])


@dataclasses.dataclass(frozen=True)
class EarlyWithoutCarried(Preparation):
    @override
    def prepare(self, context: TrainingContext, window: Window) -> None:
        call = context.windows.call
        early = call is None or call.window is not window  # run by unscale_gradients(), not in the closing step()
        for step in self.steps:
            if not (early and isinstance(step, AddCarried)):
                step(context, window)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = EarlyWithoutCarried(steps=preparation.steps, evaluation=preparation.evaluation)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
