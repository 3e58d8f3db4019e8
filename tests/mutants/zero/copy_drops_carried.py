"""ZERO-007 broken: a copy of the context (``pickle``, ``copy.deepcopy``) loses the part its open windows carry.

The copy's windows keep their micro-steps and lose what they took from the last real step.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FAULT_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_taken_carried_part_is_window_state[pickle mid-window]",
        "test_a_taken_carried_part_is_window_state[deepcopy mid-window]",
        FAULT_PROPERTY,
    ],
)


class Context(MutantContext):
    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for window in self.windows:
            window.carried = None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
