"""CKPT-004 broken: a copy of a context starts a fresh iteration; the pending loss-scaler update is not carried.

A ``pickle`` or ``deepcopy`` taken inside ``batch()`` after a real step rebuilds its scaler from the scaler's state
dict alone: the copy's resumed block updates the scale without the steps taken before the copy.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("CKPT-004", ["test_copy_inside_batch_carries_the_pending_update"], cells=F16)


class Context(MutantContext):
    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        scaling = self.parts.scaling
        if isinstance(scaling, GradScaling):
            scaling.load_state_dict({**scaling.state_dict(), "pending_update": None})


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
