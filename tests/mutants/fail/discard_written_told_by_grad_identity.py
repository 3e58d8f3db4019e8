"""FAIL-002 broken: a write into the window is told by gradient identity, not by version counters.

The framework notes each gradient tensor at the start of the call and calls the window "written" when a
gradient went from ``None`` to a tensor or was replaced by another tensor. That catches the first backward of a
window, but autograd accumulates a later backward in place into the existing ``.grad`` (same tensor, version
counter moved): a call that fails after such a backward is taken for one that wrote nothing, and its partial
gradients stay in the window, with the window's length and ``last_outcome`` as if nothing happened.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Discard, Transaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-002",
    [
        "test_a_call_that_fails_before_any_backward_changes_nothing[discard]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[plain-backward-cut-short]",
    ],
    blind="contract 2026.12.6",
)


class IdentityDiscard(Discard):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _IdentityTransaction(tensors)


class _IdentityTransaction:
    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tensors
        self._ids = [None if tensor.grad is None else id(tensor.grad) for tensor in tensors]

    def before_in_place(self, call: Call) -> None:
        pass

    def after_closure(self, call: Call) -> None:
        pass

    def cleared(self, set_to_none: bool) -> None:
        pass

    def commit(self) -> None:
        pass

    def written(self) -> bool:
        return any(
            (None if tensor.grad is None else id(tensor.grad)) != before
            for tensor, before in zip(self.tensors, self._ids, strict=True)
        )

    def fail(self, call: Call) -> bool:
        if not (self.written() or call.reached_the_step):
            return False
        for tensor in self.tensors:
            tensor.grad = None
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = IdentityDiscard()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
