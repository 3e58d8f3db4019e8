"""CLIP-001 broken: configured clipping reaches the parameters the optimizer held when it was wrapped.

The wrapper lists the optimizer's parameters once, at wrap time, for its clipping: a parameter group added later
with ``add_param_group`` is neither counted in the norm nor clipped.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.reference.preparation import Clipping, PreparationStep
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-001", ["test_configured_clipping_spans_groups_and_spares_other_windows"])

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class ClippingListedAtWrap(Clipping):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        at_wrap: list[torch.Tensor] = vars(window)["clipped_at_wrap"]
        clip_gradients(at_wrap, self.value, self.algorithm)


def _listed_at_wrap(step: PreparationStep) -> PreparationStep:
    return ClippingListedAtWrap(step.value, step.algorithm) if isinstance(step, Clipping) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_listed_at_wrap, preparation.steps)),
            evaluation=tuple(map(_listed_at_wrap, preparation.evaluation)),
        )

    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        vars(self.windows[-1])["clipped_at_wrap"] = self.windows[-1].params()
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
