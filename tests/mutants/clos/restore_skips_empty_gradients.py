"""CLOS-003 broken: under ``"restore"`` a failed call puts back only the gradients that were not ``None``.

The framework's rollback is "put back what the window held": for each tensor whose gradient was a tensor before
the call it restores that gradient, and it skips those that were ``None`` ("nothing to put back"). A closure that
raises after its backward, in the first call of a window (or with a parameter the window had not reached yet),
leaves its partial gradients in the window, and the next real step applies them.
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
    "CLOS-003",
    ["test_restore_returns_to_the_last_successful_call", "test_generated_schedules_with_raising_closures[restore]"],
    blind="contract 2026.12.6",
)


class _HeldOnlyTransaction(RestoreTransaction):
    @override
    def fail(self, call: Call) -> bool:
        for tensor, grad in zip(self.tensors, self.before, strict=True):
            if grad is not None:
                tensor.grad = grad
        return False


class HeldOnlyRestore(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _HeldOnlyTransaction(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "restore":
            self.parts.failure = HeldOnlyRestore()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
