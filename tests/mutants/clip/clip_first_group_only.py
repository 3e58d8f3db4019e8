"""CLIP-001 broken: configured clipping reaches only the optimizer's first parameter group.

``clip_grad_norm_(optimizer.param_groups[0]["params"], max_norm)``: the parameters of the other groups are
neither counted in the norm nor clipped. An optimizer built on ``model.parameters()`` has one group and looks right.
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


class FirstGroupClipping(Clipping):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        clip_gradients(window.optimizer.param_groups[0]["params"], self.value, self.algorithm)


def _first_group_only(step: PreparationStep) -> PreparationStep:
    return FirstGroupClipping(step.value, step.algorithm) if isinstance(step, Clipping) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_first_group_only, preparation.steps)),
            evaluation=tuple(map(_first_group_only, preparation.evaluation)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
