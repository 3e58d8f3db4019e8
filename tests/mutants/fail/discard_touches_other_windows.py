"""FAIL-002 broken: a discarded window takes the context's other open windows with it.

A framework that clears every gradient of the model when a call fails (``model.zero_grad()`` in its error handler)
instead of the failed wrapper's: another optimizer's accumulated micro-steps are lost with nothing said.
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
        "test_a_discarded_window_is_gone_and_the_next_is_exact[closure-after-backward-2-wrappers]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[prepared-in-closure-same-iteration]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[prepared-then-accumulated]",
        "test_a_two_pass_optimizer_whose_second_evaluation_raises[discard]",
    ],
)


class _ClearsEverything:
    def __init__(self, inner: Transaction, context: MutantContext) -> None:
        self._inner, self._context = inner, context

    def before_in_place(self, call: Call) -> None:
        self._inner.before_in_place(call)

    def after_closure(self, call: Call) -> None:
        self._inner.after_closure(call)

    def cleared(self, set_to_none: bool) -> None:
        self._inner.cleared(set_to_none)

    def commit(self) -> None:
        self._inner.commit()

    def fail(self, call: Call) -> bool:
        discarded = self._inner.fail(call)
        if discarded:
            for window in self._context.windows:
                for param in window.params():
                    param.grad = None
                window.length = 0
        return discarded


class _DiscardEverything(Discard):
    def __init__(self, context: MutantContext) -> None:
        self._context = context

    @override
    def begin(self, call: Call, tensors: Sequence[torch.Tensor], *, stash: bool, in_place: bool) -> Transaction:
        return _ClearsEverything(super().begin(call, tensors, stash=stash, in_place=in_place), self._context)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.on_failure == "discard":
            self.parts.failure = _DiscardEverything(self)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
