"""TXN-001 broken: under ``"restore"`` the window before a real step is kept by reference, not copied.

The framework's restore keeps "the window's gradient tensors" when a call begins and, where it cannot set them
aside (a ``step()`` without a closure after ``opt.backward(loss)``, the backward-then-step form), assumes that
holding the tensors is holding their values. The window's preparation (mean, unscaling, clipping) works in place
on those very tensors, so when the inner step raises the window is "restored" already divided by its length;
retrying the call divides it again and applies a fraction of the window's true mean.
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
    "TXN-001", ["test_failed_inner_step_leaves_the_window[restore-cut-short-backward-adam]"], blind="contract 2026.12.6"
)


class _ByReferenceTransaction(RestoreTransaction):
    @override
    def before_in_place(self, call: Call) -> None:
        self.kept = True  # "we hold the window's tensors already"


class ByReferenceRestore(Restore):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _ByReferenceTransaction(tensors, stash=stash, in_place=in_place, real=call.real)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "restore":
            self.parts.failure = ByReferenceRestore()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
