"""CLIP-001 broken: clipping by norm clips each parameter group to the threshold on its own.

The loop ``for group in optimizer.param_groups: clip_grad_norm_(group["params"], max_norm)``, common in training
scripts with per-layer learning rates: each group's norm is bounded instead of the total over all of the
optimizer's parameters, so an optimizer with two groups may apply up to ``sqrt(2)`` times the clipped norm.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.reference.preparation import Clipping, PreparationStep
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("CLIP-001", ["test_configured_clipping_spans_groups_and_spares_other_windows", ORACLE_PROPERTY])


class PerGroupClipping(Clipping):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        for group in window.optimizer.param_groups:
            clip_gradients(group["params"], self.value, self.algorithm)


def _per_group(step: PreparationStep) -> PreparationStep:
    return PerGroupClipping(step.value, step.algorithm) if isinstance(step, Clipping) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_per_group, preparation.steps)),
            evaluation=tuple(map(_per_group, preparation.evaluation)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
