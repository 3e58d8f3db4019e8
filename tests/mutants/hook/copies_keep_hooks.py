"""HOOK-005 broken: copies of a context keep the hooks the original registered.

The reading that a copy is "the same training state, hooks included": a deep copy shares or copies them, and a pickle
fails on the first lambda hook.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-005", ["test_copies_carry_no_hooks[pickle]", "test_copies_carry_no_hooks[deepcopy]"])


class Context(MutantContext):
    @override
    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["parts"].hooks = self.parts.hooks  # the defect: the hooks travel with the copy
        return state


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
