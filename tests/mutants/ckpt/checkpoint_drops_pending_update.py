"""CKPT-004 broken: the context's state holds the loss scaler's own state dict, not the iteration's pending update.

A checkpoint taken inside ``batch()`` after a real step forgets that an optimizer stepped (and whether its gradients
were finite): the resumed block updates the scale from the steps it takes itself, or not at all, so an overflow
before the checkpoint no longer backs the scale off.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("CKPT-004", ["test_checkpoint_inside_batch_carries_the_pending_update"], cells=F16)


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if isinstance(state.get("scaler"), dict):
            state["scaler"]["pending_update"] = None  # GradScaler.state_dict() alone
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
