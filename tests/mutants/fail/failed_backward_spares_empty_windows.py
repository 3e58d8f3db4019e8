"""FAIL-008 broken: a failed ``backward()`` outside ``step()`` leaves what it wrote into a window that was empty.

Under ``on_failure="discard"`` the transaction discards only the windows that held gradients before the backward
and were written: a window with nothing in it "has nothing to discard", so the partial gradients the failed backward
wrote there (a hook raising after autograd, memory running out halfway) stay on its parameters, its
``last_outcome`` is not ``DISCARDED``, and the next micro-step or real step adds to them, applying a batch the user
was told had failed.

Plausible: discarding is thought of as dropping accumulated micro-steps, and a window of length 0 has none; the
spec's "a failed call of every window it wrote into" does not depend on what the window held.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.failure import BackwardTransaction, Discard
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-008",
    [
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a+b-2-held-discard]",
    ],
    blind="batch 5",
)


class HeldWindowsOnly(BackwardTransaction):
    __slots__ = ()

    @override
    def fail(self) -> list[int]:
        if self.keep:
            return super().fail()
        discarded = [
            index
            for index in range(len(self.windows))
            if self.written(index) and any(grad is not None for grad in self.grads[index])  # the defect
        ]
        for index in discarded:
            for tensor in self.windows[index]:
                tensor.grad = None
        return discarded


class SparesEmptyWindows(Discard):
    @override
    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        return HeldWindowsOnly(windows, keep=False)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = SparesEmptyWindows()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a failed backward() leaves its partial gradients in empty windows")
