"""AMP-003 broken: the iteration's scaler update runs only when the first optimizer stepped in it.

The end of the iteration asks the first wrapper, not every one, whether it stepped: when only another optimizer
steps (and overflows), the scale does not back off, and the next iterations keep scaling losses by a scale that
PyTorch's rule would have halved. Only schedules where the first optimizer accumulates while another steps
show it.
"""

from __future__ import annotations

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    _first_stepped: bool = False

    def _finish_real_step(self, slot: Slot) -> None:
        if slot is self._slots[0]:
            self._first_stepped = True
        super()._finish_real_step(slot)

    def _end_iteration(self) -> None:
        if isinstance(self._scaling, GradScaling) and not self._first_stepped:
            self._scaling._stepped_since_update = False
        self._first_stepped = False
        super()._end_iteration()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
