"""ZERO-007 broken: the context's state holds an open window's gradients but not the part it carries.

A checkpoint taken mid-window resumes to a window that applies its mean alone.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import RESUME_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_taken_carried_part_is_window_state[checkpoint mid-window]",
        "test_a_taken_carried_part_is_window_state[checkpoint between windows]",
        RESUME_PROPERTY,
    ],
)


class DropsCarried(StateFormat):
    @override
    def save(self, context: TrainingContext) -> dict[str, Any]:
        state = super().save(context)
        for entry in state["optimizers"]:
            entry["carried"] = [None] * len(entry["carried"])
        return state


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = DropsCarried()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
