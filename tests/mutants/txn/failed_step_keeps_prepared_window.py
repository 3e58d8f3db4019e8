"""TXN-001 broken: a real step whose inner step raises leaves the window as its preparation made it.

The transaction covers the closure only: once the window was averaged, unscaled and clipped for the inner step, a
failure there keeps those gradients (and the failed call's closure's), so a retry averages and unscales them again.
Under ``on_failure="restore"`` a call that prepared its window puts nothing back when it fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Restore, RestoreTransaction, Transaction
from lightning_optimizer.spec import ImplementationInfo
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


class _KeepsThePreparedWindow(RestoreTransaction):
    @override
    def fail(self, call: Call) -> bool:
        if call.prepared_here:  # the preparation ran in this call: its gradients are kept
            return False
        return super().fail(call)


class _RestoreUpToThePreparation(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _KeepsThePreparedWindow(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "restore":
            self.parts.failure = _RestoreUpToThePreparation()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
