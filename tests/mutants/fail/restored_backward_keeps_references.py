"""FAIL-008 broken: under ``"restore"`` a failed ``backward()`` outside ``step()`` puts back the gradient tensors it
kept, not their values.

The restoring transaction of a backward between calls keeps a reference to each window's gradient tensors (no copy)
and, when the backward raises, sets each ``.grad`` back to the tensor it kept. Autograd accumulates into an existing
dense gradient in place, so the kept tensors already hold the failed backward's contribution: the windows come back
with the failed micro-step added in, while their lengths do not count it.

Plausible: autograd replaces ``.grad`` when it was ``None`` and under ``create_graph``, and "keep the old tensors"
looks like a free restore; copying every window's gradients is exactly the memory cost FAIL-004 names, which an
implementer wants to avoid.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.failure import BackwardTransaction, Restore
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-008",
    [
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a+b-1-held-restore]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a+b-2-held-restore]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a-1-held-restore]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a-2-held-restore]",
    ],
    blind="batch 5",
)


class ReferencesOnly(BackwardTransaction):
    __slots__ = ()

    @override
    def fail(self) -> list[int]:
        for tensors, grads in zip(self.windows, self.grads, strict=True):
            for tensor, grad in zip(tensors, grads, strict=True):
                tensor.grad = grad  # the defect: the same tensor, which autograd may have written in place
        return []


class RestoreByReference(Restore):
    @override
    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        return ReferencesOnly(windows, keep=False)  # nothing copied


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "restore":
            self.parts.failure = RestoreByReference()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a restored backward() puts back gradient tensors written in place")
