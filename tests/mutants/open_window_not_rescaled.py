"""AMP-006 broken: a window left open across a change of the loss scale is not rescaled.

The scale backs off after another optimizer's overflow; the open window keeps gradients scaled by the old scale
next to new ones scaled by the new scale, and its real step unscales all of them by the new one.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _end_iteration(self) -> None:
        self._scaling.update(())


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
