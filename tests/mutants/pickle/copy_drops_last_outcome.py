"""PICKLE-001 broken: a ``pickle`` or ``copy.deepcopy`` of the context resets every ``last_outcome`` to ``None``.

STEP-004 says ``last_outcome`` is not part of the context's state and a loaded checkpoint reports ``None``; the
implementer applies the same reading to copies, which are "a state of the context" too. PICKLE-001 says otherwise:
a copy carries ``last_outcome`` (it is a working copy of the whole training state, not a checkpoint).
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("PICKLE-001", ["test_last_outcome_is_not_in_the_context_state"], blind="batch 1")


class Context(MutantContext):
    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        for window in self.windows:
            window.last_outcome = None  # like load_state_dict (STEP-004)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
