"""FAIL-002 broken: any failed call discards its window, also one that failed before any backward wrote into it.

A framework that drops the window whenever ``step()`` raises: a closure that raises on a bad batch before its
backward (a data error, a refused argument inside it) loses the micro-steps the window had accumulated.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.failure import Discard, ParameterRollback, Transaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-002",
    [
        "test_a_call_that_fails_before_any_backward_changes_nothing[discard]",
        "test_a_raising_hook_fails_the_call_as_a_raising_closure_does[discard]",
        "test_closure_that_raises_changes_nothing[discard]",
    ],
)


class _AlwaysDiscards:
    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.tensors = tensors

    def before_in_place(self, call: Call) -> None:
        """Nothing kept."""

    def after_closure(self, call: Call) -> None:
        """Nothing to merge."""

    def cleared(self, set_to_none: bool) -> None:
        """Nothing to forget."""

    def commit(self) -> None:
        """Nothing kept."""

    def fail(self, call: Call) -> bool:
        for tensor in self.tensors:
            tensor.grad = None
        return True


class _DiscardAlways(Discard):
    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return ParameterRollback(call.window.optimizer)
        return _AlwaysDiscards(tensors)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "discard":
            self.parts.failure = _DiscardAlways()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
