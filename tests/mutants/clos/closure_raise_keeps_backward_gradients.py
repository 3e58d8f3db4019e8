"""CLOS-003 broken: a closure that raises after its backward leaves that backward's gradients in the window.

The next real step then applies the failed micro-batch's gradients too (the reference before this rule was checked).
Under ``on_failure="restore"`` a failed call adds the window it set aside into the closure's gradients, as a call
that succeeded does, instead of putting it back.
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

MUTANT = Mutant("CLOS-003", ["test_closure_that_raises_changes_nothing[restore]"])


class _KeepsTheBackward(RestoreTransaction):
    @override
    def fail(self, call: Call) -> bool:
        self.after_closure(call)  # the raising closure's backward stays in the window
        return False


class _RestoreKeepingTheBackward(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _KeepsTheBackward(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "restore":
            self.parts.failure = _RestoreKeepingTheBackward()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
