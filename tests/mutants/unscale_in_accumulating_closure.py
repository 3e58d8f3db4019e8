"""CLIP-002 broken: ``unscale_gradients()`` accepted in the closure of a step that does not close the window.

The window is then prepared (its mean taken) one micro-step early, and the closing step applies the wrong mean.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _unscale_gradients(self, index: int) -> None:
        self._prepare_gradients(self._slots[index])


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
