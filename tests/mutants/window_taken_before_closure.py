"""CLOS-003 broken: a real step takes (and resets) the window before its closure runs.

Correct while closures succeed; a closure that raises leaves the window counted as closed, so the micro-steps
already accumulated are mixed into a later window that is normalised by the wrong length.
"""

from __future__ import annotations

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    _taken: dict[int, int]

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        real = super()._closes_window(slot, make_optimizer_step)
        if real:
            self.__dict__.setdefault("_taken", {})[id(slot)] = slot.pending + 1
            slot.pending = 0
        return real

    def _normalise_window(self, slot: Slot) -> None:
        normalise_window(slot.params(), self._taken.pop(id(slot)))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
