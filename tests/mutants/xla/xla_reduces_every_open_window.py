"""XLA-001 broken: a real step reduces every optimizer's gradients, other optimizers' open windows included.

As a strategy that runs ``xm.reduce_gradients`` over all of the model's optimizers whenever one of them steps:
a window left open while another optimizer steps is reduced there, then again at its own real step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.preparation import Preparation, Reduction
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA_F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("XLA-001", ["test_each_window_is_reduced_once_and_a_skipped_step_cuts_once"], cells=XLA_F16)


class EveryOptimizer(Reduction):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        for other in context.windows:
            if other is window or other.length:
                context.parts.device.reduce_gradients(other.optimizer)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        steps = tuple(EveryOptimizer() if type(step) is Reduction else step for step in preparation.steps)
        self.parts.preparation = Preparation(steps=steps, evaluation=preparation.evaluation)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
