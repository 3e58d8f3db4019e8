"""ACC-001 broken: the window's gradients are divided by ``accumulate_grad_batches``, not by its real length.

Right for full windows; wrong for one cut short by ``make_optimizer_step=True`` or flushed at the epoch's end.
"""

from __future__ import annotations

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _normalise_window(self, slot: Slot) -> None:
        normalise_window(slot.params(), self._accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
