"""XLA-001 broken: the window's gradients are clipped before they are reduced across replicas.

Lightning 1.x on TPUs: the training loop clips the gradients, then ``xm.optimizer_step`` reduces them and steps. Each
replica clips its own gradient by its own norm, so the reduced gradient is not the clipped reduced gradient (with a
norm up to the threshold divided by the world size where the replicas disagree).
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _prepare_gradients(self, slot: Slot) -> None:
        self._normalise_window(slot)
        self._unscale(slot)
        self._clip(slot)
        self._reduce_gradients(slot)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
