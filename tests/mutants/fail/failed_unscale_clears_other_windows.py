"""FAIL-007 broken: a window discarded by a failed ``unscale_gradients()`` takes every optimizer's gradients with it.

Under ``on_failure="discard"`` the preparation's transaction clears, when ``unscale_gradients()`` fails between calls,
the gradients of every parameter of the context (every wrapped optimizer's), as ``model.zero_grad(set_to_none=True)``
would, instead of those of the failing window. Another optimizer's open window (a GAN's generator accumulating while
the discriminator's preparation fails) loses its micro-steps without any note, and its real step applies only what
came after.

Plausible: frameworks that skip a failed batch call ``model.zero_grad()``, and "discard the gradients" is written the
same way; FAIL-002's "a failed call never touches the windows of the context's other wrappers" is about ``step()``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.failure import Discard, PreparationTransaction
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-007",
    [
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-before-unscaling-cut-short-2-discard-next-batch]"
    ],
    cells=F16,
    blind="batch 4",
)


class DiscardEverything(Discard):
    """A discard of a failed preparation that clears the gradients of every window of the context."""

    def __init__(self, context: Any) -> None:
        self.context: Callable[[], Any] = weakref.ref(context)

    @override
    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        context = self.context()
        if context is None:
            return super().begin_preparation(tensors, changes=changes)
        every = [tensor for window in context.windows.all for tensor in context.parts.parallel.window_tensors(window)]
        return PreparationTransaction(every, keep=False)  # the defect: every window's tensors, not the failing one's

    @override
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.context = lambda: None


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = DiscardEverything(self)

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.parts.failure.name == "discard":
            self.parts.failure = DiscardEverything(self)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a discarded unscale_gradients() clears every optimizer's window")
