"""CKPT-002 broken: the context's checkpoint saves a fresh loss scaler's state, not the live one's.

Windows, gradients and counts are saved, the ``GradScaler``'s scale and growth tracker are not: a run resumed
after an overflow starts again from the initial scale, so its losses are scaled differently from the
uninterrupted run's.
"""

from __future__ import annotations

from typing import Any

from torch.amp.grad_scaler import GradScaler
from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, RESUME_PROPERTY, Mutant

MUTANT = Mutant(
    "CKPT-002",
    ["test_resume_at_every_micro_step_is_bit_identical", "test_resume_in_a_fresh_process", RESUME_PROPERTY],
    cells=F16,
)


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.scaler is not None:
            state["scaler"] = GradScaler(self.device.type).state_dict()
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
