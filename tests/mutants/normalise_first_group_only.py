"""ACC-001 broken: the window's mean is taken over the first parameter group only.

Code written for ``optimizer.param_groups[0]["params"]`` (the one-group case of most examples): with a second
group of other hyper-parameters (a head with its own learning rate, no weight decay on biases), that group steps
on the window's sum.
"""

from __future__ import annotations

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _normalise_window(self, slot: Slot) -> None:
        if slot.pending:
            normalise_window(slot.optimizer.param_groups[0]["params"], slot.pending + 1)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
