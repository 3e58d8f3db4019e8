"""CLIP-001 broken: each real step clips the gradients of every wrapped optimizer, the whole model's.

``clip_grad_norm_(model.parameters(), max_norm)`` before ``optimizer.step()``, as training scripts and Accelerate's
``accelerator.clip_grad_norm_(model.parameters(), ...)`` do: with several optimizers, the norm includes the other
optimizers' gradients (under 16-mixed still scaled, in their open windows), and those gradients are clipped too,
so another optimizer's open window changes while it accumulates.
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

MUTANT = Mutant(
    "CLIP-001",
    [
        "test_configured_clipping_spans_groups_and_spares_other_windows",
        "test_unscale_gradients_prepares_only_its_own_window",
        ORACLE_PROPERTY,
    ],
)


class WholeModelClipping(Clipping):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        everything = [param for other in context.windows for param in other.params()]
        clip_gradients(everything, self.value, self.algorithm)


def _whole_model(step: PreparationStep) -> PreparationStep:
    return WholeModelClipping(step.value, step.algorithm) if isinstance(step, Clipping) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_whole_model, preparation.steps)),
            evaluation=tuple(map(_whole_model, preparation.evaluation)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
