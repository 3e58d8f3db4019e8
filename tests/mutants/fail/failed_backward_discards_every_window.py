"""FAIL-008 broken: a wrapper's ``backward()`` outside ``step()`` that fails discards every window of the context.

Under ``on_failure="discard"`` the transaction of a backward between calls clears, when the backward raises after
autograd wrote, the gradients of every window of the context and reports each of them discarded (length 0,
``last_outcome`` ``DISCARDED``, a note per window), instead of only the windows the backward wrote into. A GAN's
discriminator backward whose ``after_backward`` hook raises then also drops the generator's open window, whose
parameters the loss never reached.

Plausible: "autograd writes into any window the loss reaches" suggests the backward is a call of every window, and
discarding all of them is the safe-looking reading; "the others are untouched" is the clause that says otherwise.
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
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a-1-held-discard]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a-2-held-discard]",
    ],
    blind="batch 5",
)


class DiscardAllBackward(BackwardTransaction):
    __slots__ = ()

    @override
    def fail(self) -> list[int]:
        if self.keep:
            return super().fail()
        if not any(self.written(index) for index in range(len(self.windows))):
            return []  # nothing written: nothing changes (FAIL-002)
        for tensors in self.windows:  # the defect: every window, written into or not
            for tensor in tensors:
                tensor.grad = None
        return list(range(len(self.windows)))


class DiscardEveryWindow(Discard):
    @override
    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        return DiscardAllBackward(windows, keep=False)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = DiscardEveryWindow()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a failed backward() between calls discards every window")
