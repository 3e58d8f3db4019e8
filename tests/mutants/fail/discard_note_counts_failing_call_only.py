"""FAIL-003 broken: the exception's note counts only the failing call's micro-step.

The framework's discard transaction does the whole discard in one place: gradients to ``None`` and the window's
length to 0. The note is written after it, from the window's length as it now is, so it always says one
micro-step was lost, whatever the window had accumulated before the failing call. Everything else of the
discard is right; the user is told a smaller loss than the one they had.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Discard, DiscardTransaction, Transaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-003",
    [
        "test_a_discarded_window_is_gone_and_the_next_is_exact[plain-backward-cut-short]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[closure-after-backward-outside-batch]",
    ],
    blind="contract 2026.12.6",
)


class WholeDiscard(Discard):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _WholeDiscardTransaction(tensors)


class _WholeDiscardTransaction(DiscardTransaction):
    @override
    def fail(self, call: Call) -> bool:
        discarded = super().fail(call)
        if discarded:
            call.window.length = 0  # "length 0" done with the gradients
        return discarded


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = WholeDiscard()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
