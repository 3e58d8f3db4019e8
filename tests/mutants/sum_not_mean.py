"""ACC-001 broken: a real step applies the sum of the window's gradients, not their mean.

The accumulated ``.grad`` is handed to the inner optimizer as it is, with no normalisation at all.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.preparation import WindowMean
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(step for step in preparation.steps if not isinstance(step, WindowMean)),
            evaluation=preparation.evaluation,
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
