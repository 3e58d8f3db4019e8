"""ZERO-007 broken (with FAIL-003): a failed call under ``on_failure="discard"`` keeps the window's carried part.

Reasoning: the carried gradients come from a step that succeeded; the failed micro-step did not make them, so
discarding "the window" (its micro-steps) should not throw them away, and the retry still applies them. ZERO-007: a
window's carried part fails with it: ``"discard"`` clears it with the window (and the note says so). The next window
of the mutant applies ``c + g`` where the contract's applies ``g``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.zeroing import LeaveToUser
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "ZERO-007",
    [
        "test_a_failed_window_discards_or_restores_its_carried_part[first micro-step-discard]",
        "test_a_failed_window_discards_or_restores_its_carried_part[inner step-discard]",
    ],
    blind="batch 3",
)


class _KeepsCarriedOnDiscard(LeaveToUser):
    @override
    def drop(self, window: Window) -> None:
        window.left = None  # the failed micro-steps go; the last real step's gradients stay carried


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if not self.parts.zeroing.clears_after_step:
            self.parts.zeroing = _KeepsCarriedOnDiscard()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
