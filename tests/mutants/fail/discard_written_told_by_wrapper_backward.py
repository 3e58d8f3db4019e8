"""FAIL-002 broken: a failed call's writes are told by whether the closure called a wrapper's ``backward``.

The framework counts its own ``backward`` calls ("the wrapper's backward is how gradients get into the window")
and discards a failed call's window only when the count moved or the real step began. A closure that ran a plain
``loss.backward()`` before raising is then taken for one that wrote nothing: its partial gradients stay added
into the window, which keeps its length and ``last_outcome``, and the next real step applies them.
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


class CountingDiscard(Discard):
    """Discard, with "written" read from the number of wrapper backwards run since the call began."""

    def __init__(self) -> None:
        self.backwards = 0

    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        if call.window.evaluates_closure and call.real:
            return super().begin(call, tensors, stash=stash, in_place=in_place)
        return _CountingTransaction(self, tensors)


class _CountingTransaction:
    def __init__(self, policy: CountingDiscard, tensors: Sequence[torch.Tensor]) -> None:
        self._policy, self.tensors, self._start = policy, tensors, policy.backwards

    def before_in_place(self, call: Call) -> None:
        pass

    def after_closure(self, call: Call) -> None:
        pass

    def cleared(self, set_to_none: bool) -> None:
        pass

    def commit(self) -> None:
        pass

    def fail(self, call: Call) -> bool:
        if self._policy.backwards == self._start and not call.reached_the_step:
            return False  # "no backward ran": nothing to discard
        for tensor in self.tensors:
            tensor.grad = None
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = CountingDiscard()

    @override
    def backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if isinstance(self.parts.failure, CountingDiscard):
            self.parts.failure.backwards += 1
        super().backward(wrapper, loss, *args, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
