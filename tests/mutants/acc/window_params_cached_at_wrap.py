"""ACC-001 broken: the window's mean is taken over the parameters the optimizer held when it was wrapped.

The wrapper lists ``[p for g in optimizer.param_groups for p in g["params"]]`` once, at wrap time, and divides
those gradients by the window's length: a parameter group added later with ``add_param_group`` steps on the sum of
its window's gradients.
"""

from __future__ import annotations

from typing import Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import PreparationStep, WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ACC-001", [ORACLE_PROPERTY])

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class WindowMeanListedAtWrap(WindowMean):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if window.length:
            at_wrap: list[torch.Tensor] = vars(window)["at_wrap"]
            normalise_window(at_wrap, window.length + 1)


def _listed_at_wrap(step: PreparationStep) -> PreparationStep:
    return WindowMeanListedAtWrap() if isinstance(step, WindowMean) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_listed_at_wrap, preparation.steps)), evaluation=preparation.evaluation
        )

    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        vars(self.windows[-1])["at_wrap"] = self.windows[-1].params()
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
