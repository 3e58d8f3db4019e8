"""CLIP-001 broken: ``gradient_clip_val`` is accepted and stored, but no step clips.

As in manual optimization, where the trainer's clipping settings silently do nothing.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import Clipping, Preparation
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLIP-001", ["test_configured_clipping"])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = Preparation(
            steps=tuple(step for step in preparation.steps if not isinstance(step, Clipping)),
            evaluation=tuple(step for step in preparation.evaluation if not isinstance(step, Clipping)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
