"""ZERO-007 broken (with CKPT-002): the context's state does not hold the carried part of an open window.

Reasoning from ZERO-007's own sentence, "gradients that a real step left ... are the user's, as an optimizer's
``state_dict()`` holds no gradients: they are not context state", generalised to the carried part: the state saves
the open window's own gradients (CKPT-002) and leaves the last step's gradients out. A run resumed from a state taken
after the window took them (any micro-step of an accumulating window) never applies them. ZERO-007: "Once taken it is
part of the window: a state or copy holds it".
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_taken_carried_part_is_window_state[checkpoint mid-window]",
        "test_a_taken_carried_part_is_window_state[checkpoint between windows]",
    ],
    blind="batch 3",
)


class _NoCarried(StateFormat):
    @override
    def save(self, context: Any) -> dict[str, Any]:
        state = super().save(context)
        for entry in state["optimizers"]:
            entry["carried"] = [None] * len(entry["carried"])  # the last step's gradients are the user's
        return state


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = _NoCarried()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
