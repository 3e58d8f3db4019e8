"""FAIL-007 broken: under "restore", ``unscale_gradients()`` copies the gradients of the first parameter group only.

The restoring policy copies the window's gradients before a preparation between calls writes into them, and puts
the copies back when it fails. This one takes the parameters to copy from ``optimizer.param_groups[0]["params"]``:
the gradients of every other group are put back as the failed preparation left them (divided by the window's length
already), and the retry divides them again, so those groups apply a fraction of their mean.

Plausible: nearly every example has one parameter group, and ``param_groups[0]["params"]`` is the idiom for "the
optimizer's parameters" in much code; the other groups are only missed by a test with several.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
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
        "test_a_failed_unscale_gradients_follows_the_policy[2-groups-no-clip-fails-before-unscaling-window-of-1-restore-step]"
    ],
    cells=F16,
    blind="batch 4",
)


class FirstGroupPreparationTransaction(PreparationTransaction):
    """Copies the gradients of the optimizer's first group; the other groups' tensors are kept as they are."""

    def __init__(self, tensors: Sequence[torch.Tensor], first_group: Sequence[torch.Tensor]) -> None:
        super().__init__(tensors, keep=True, copy=False)
        copied = {id(param) for param in first_group}
        self.before = [
            tensor.grad.detach().clone() if tensor.grad is not None and id(tensor) in copied else tensor.grad
            for tensor in tensors
        ]


class FirstGroupRestore(Restore):
    def __init__(self, context: Any) -> None:
        self.context: Callable[[], Any] = weakref.ref(context)

    @override
    def begin_preparation(self, tensors: Sequence[torch.Tensor], *, changes: bool) -> PreparationTransaction:
        if not changes:
            return super().begin_preparation(tensors, changes=changes)
        context = self.context()
        first_group: Sequence[torch.Tensor] = tensors
        for window in context.windows.all if context is not None else ():
            if window.params() and tensors and window.params()[0] is tensors[0]:
                first_group = window.optimizer.param_groups[0]["params"]
        return FirstGroupPreparationTransaction(tensors, first_group)

    @override
    def __getstate__(self) -> dict[str, Any]:
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.context = lambda: None


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "restore":
            self.parts.failure = FirstGroupRestore(self)

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.parts.failure.name == "restore":
            self.parts.failure = FirstGroupRestore(self)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a restored unscale_gradients() copies the first parameter group only")
