"""CLIP-001 broken: a closure-evaluating optimizer (LBFGS) never sees clipped gradients.

Clipping sits in the first-order path, right before the inner step; LBFGS computes its gradients inside its own
``step`` and uses them unclipped (the behaviour of this project's reference before contract 2026.12, and of
wrappers that clip before ``optimizer.step(closure)``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_optimizer.reference.preparation import Clipping
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-001", ["test_lbfgs_clips_every_evaluation"])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        # Each evaluation's gradients are reduced, never clipped.
        self.parts.preparation = dataclasses.replace(
            preparation, evaluation=tuple(step for step in preparation.evaluation if not isinstance(step, Clipping))
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
