"""ZERO-005 broken: configured clipping clips the window's mean alone; the carried part is added after it, unclipped.

The step applies more than the clip allows whenever the carried part is large.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lightning_optimizer.reference.preparation import AddCarried
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ZERO-005", ["test_configured_clipping_clips_the_carried_part_with_the_rest", ORACLE_PROPERTY])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        steps = [step for step in self.parts.preparation.steps if not isinstance(step, AddCarried)]
        self.parts.preparation = dataclasses.replace(self.parts.preparation, steps=(*steps, AddCarried()))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
