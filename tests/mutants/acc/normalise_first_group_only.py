"""ACC-001 broken: the window's mean is taken over the first parameter group only.

Code written for ``optimizer.param_groups[0]["params"]`` (the one-group case of most examples): with a second
group of other hyper-parameters (a head with its own learning rate, no weight decay on biases), that group steps
on the window's sum.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import PreparationStep, WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ACC-001", [ORACLE_PROPERTY])


class FirstGroupWindowMean(WindowMean):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if window.length:
            normalise_window(window.optimizer.param_groups[0]["params"], window.length + 1)


def _first_group_only(step: PreparationStep) -> PreparationStep:
    return FirstGroupWindowMean() if isinstance(step, WindowMean) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_first_group_only, preparation.steps)), evaluation=preparation.evaluation
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
