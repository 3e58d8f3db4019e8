"""PICKLE-001 broken: a copy carries the open window's gradients of the context's first optimizer only.

Gradients are not part of a pickled tensor, so the copy carries them explicitly, but only for ``optimizers[0]``
(the one-optimizer case that the copy was written for): a copy of another wrapper, or of the first with a second
one open, loses that window.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PICKLE-001", ["test_copy_of_either_of_two_wrappers_continues_it"])


class Context(MutantContext):
    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_open_window_grads"] = [
            grads if i == 0 else [None] * len(grads) for i, grads in enumerate(state["_open_window_grads"])
        ]
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
