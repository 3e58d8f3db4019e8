"""ZERO-007 broken (with FAIL-004): under ``on_failure="restore"`` a failed call does not give back the taken part.

The restoring transaction puts the window's own gradients back exactly (its stash); the implementer's undo of the
take only resets the bookkeeping ("nothing is left to take any more") and forgets that the take moved the gradients
off the parameters. After the failure the parameters hold no gradient where the last step left one, and the retried
call applies ``g`` instead of ``c + g``. ZERO-007: under ``"restore"`` the carried part is as before the call, taken
or not (FAIL-004).
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser, Taking
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_failed_window_discards_or_restores_its_carried_part[first micro-step-restore]",
        "test_a_failed_window_discards_or_restores_its_carried_part[before any backward-restore]",
    ],
    blind="batch 3",
)


class _UntakeForgets(LeaveToUser):
    @override
    def untake(self, window: Window, taking: Taking) -> None:
        window.left = None  # taken once: nothing left to take again
        window.carried = taking.carried


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _UntakeForgets()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
