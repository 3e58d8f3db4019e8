"""TXN-001 broken: a real step whose inner step raises is recorded as a skipped step.

The window is put back, but ``last_outcome`` says ``SKIPPED_NON_FINITE``, as if the loss scaler had skipped it: a
loop that reads the outcome then believes the window closed. Under ``on_failure="restore"`` the transaction that
puts the window back records the skip.
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
    "TXN-001",
    [
        "test_failed_inner_step_leaves_the_window[restore-window-1-closure]",
        "test_failed_inner_step_leaves_the_window[restore-window-3-closure-clipped]",
        "test_failed_inner_step_leaves_the_window[restore-cut-short-backward-adam]",
        "test_failed_inner_step_leaves_the_window[restore-retried-in-next-batch]",
    ],
)


class _ReportsASkip(RestoreTransaction):
    @override
    def fail(self, call: Call) -> bool:
        if call.real and call.prepared_here:  # it reached the inner step
            call.window.last_outcome = StepOutcome.SKIPPED_NON_FINITE
        return super().fail(call)


class _RestoreReportingASkip(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _ReportsASkip(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "restore":
            self.parts.failure = _RestoreReportingASkip()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
