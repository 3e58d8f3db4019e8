"""PICKLE-001 broken: a pickled or deep-copied context loses the open window's gradients.

Gradients are not part of a pickled tensor; the context does not carry them, so a copy taken mid-window closes
it without the micro-steps accumulated before the copy.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PICKLE-001", ["test_copies_continue_independently"])


class Context(MutantContext):
    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_open_window_grads"] = [[None] * len(grads) for grads in state["_open_window_grads"]]
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
