"""CKPT-002 broken: the context's ``state_dict`` keeps window positions but not the open window's gradients.

As a framework that checkpoints counters only: resuming mid-window steps on the rest of the window alone.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import RESUME_PROPERTY, Mutant

MUTANT = Mutant(
    "CKPT-002", ["test_resume_at_every_micro_step_is_bit_identical", "test_resume_in_a_fresh_process", RESUME_PROPERTY]
)


class Context(MutantContext):
    @override
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        for entry in state["optimizers"]:
            entry["grads"] = [None] * len(entry["grads"])
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
