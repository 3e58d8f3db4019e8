"""FAIL-004 broken: under ``"restore"`` a failed call puts the window back but reports ``DISCARDED``.

The framework's restore transaction marks every failure it handles ("the call failed, so its micro-step was
discarded") with ``StepOutcome.DISCARDED``. The gradients, length and counts are put back exactly, but
``last_outcome``, which FAIL-004 lists among what a failed call leaves as it was, now says the window was thrown
away; a framework that reads it (to log the loss, or to skip the batch) acts on a window that is still there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Restore, RestoreTransaction, Transaction
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-004",
    [
        "test_restore_returns_to_the_last_successful_call",
        "test_closure_that_raises_changes_nothing[restore]",
        "test_a_two_pass_optimizer_whose_second_evaluation_raises[restore]",
    ],
    blind="contract 2026.12.6",
)


class _MarkingRestoreTransaction(RestoreTransaction):
    @override
    def fail(self, call: Call) -> bool:
        kept = super().fail(call)
        call.window.last_outcome = StepOutcome.DISCARDED
        return kept


class MarkingRestore(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _MarkingRestoreTransaction(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "restore":
            self.parts.failure = MarkingRestore()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
