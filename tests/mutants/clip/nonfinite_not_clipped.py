"""CLIP-001 broken: a 16-mixed window whose gradients are not finite is left unclipped before its skipped step.

An implementer who knows the scaler will skip a non-finite step sees clipping it as wasted work (and
``clip_grad_norm_`` of an inf norm as a source of NaN), so clipping only runs on finite gradients. torch's recipe
clips regardless, and ``before_optimizer_step`` then sees NaN/zero gradients, not the raw infinite ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from typing_extensions import override

from lightning_optimizer.reference.clipping import clip_gradients
from lightning_optimizer.reference.preparation import Clipping, Preparation, PreparationStep
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "CLIP-001",
    [
        "test_a_non_finite_window_is_clipped_as_the_recipe_clips_it[norm]",
        "test_a_non_finite_window_is_clipped_as_the_recipe_clips_it[value]",
    ],
    cells=F16,
    blind="batch 1",
)


class _FiniteOnlyClipping(Clipping):
    @override
    def __call__(self, context, window) -> None:  # type: ignore[no-untyped-def]
        grads = [p.grad for p in window.params() if p.grad is not None]
        if grads and not math.isfinite(float(torch.nn.utils.get_total_norm(grads))):
            return  # the scaler skips this step anyway
        clip_gradients(window.params(), self.value, self.algorithm)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        prep = self.parts.preparation

        def swap(steps: Sequence[PreparationStep]) -> tuple[PreparationStep, ...]:
            return tuple(_FiniteOnlyClipping(s.value, s.algorithm) if isinstance(s, Clipping) else s for s in steps)

        self.parts.preparation = Preparation(steps=swap(prep.steps), evaluation=swap(prep.evaluation))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
