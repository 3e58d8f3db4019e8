"""FAIL-007 broken: under "restore", ``unscale_gradients()`` keeps ``grad.detach()`` views, not copies, of the window.

The restoring policy's transaction of a preparation between calls must copy the window's gradients first, because
the preparation writes into them in place (the mean of a window cut short, the unscaling, clipping). This one keeps
``grad.detach()``: a tensor that shares the gradient's storage. When the preparation raises after the mean was
written, the "restored" gradients are the halfway-prepared ones, and the retry divides them by the window's length
a second time: exactly the bug FAIL-007 was written against.

Plausible: ``detach()`` reads like "take a snapshot" and is what one writes to keep a tensor out of autograd; the
reference's own restoring transaction for a ``step()`` stashes tensors without copying them (the closure's backward
writes fresh ones), so reusing that habit here is an easy slip.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.failure import PreparationTransaction, Restore
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-007",
    [
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-before-unscaling-window-of-1-restore-step]"
    ],
    cells=F16,
    blind="batch 4",
)


class DetachedPreparationTransaction(PreparationTransaction):
    """Keeps views of the window's gradients (``detach()``) instead of copies."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        super().__init__(tensors, keep=True, copy=False)
        self.before = [None if tensor.grad is None else tensor.grad.detach() for tensor in tensors]


class DetachingRestore(Restore):
    @override
    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        return DetachedPreparationTransaction(tensors)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "restore":
            self.parts.failure = DetachingRestore()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a restored unscale_gradients() keeps views of the prepared gradients")
