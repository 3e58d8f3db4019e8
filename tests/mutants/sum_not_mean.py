"""ACC-001 broken: a real step applies the sum of the window's gradients, not their mean.

The accumulated ``.grad`` is handed to the inner optimizer as it is, with no normalisation at all.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _normalise_window(self, slot: Slot) -> None:
        pass


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
