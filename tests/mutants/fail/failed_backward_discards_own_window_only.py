"""FAIL-008 broken: a failed backward outside ``step()`` discards the calling wrapper's window only.

Under ``on_failure="discard"`` a failed ``backward()`` discards the window of the wrapper it was called on, if it
wrote there; a loss that also reached another wrapper's parameters (a generator's loss through the discriminator,
not toggled) leaves half a backward in that window, which its next real step applies as if it were a micro-step.

Plausible: a wrapper's call is read as a call of its own window, as ``step()`` is (FAIL-002: "a failed call never
touches the windows of the context's other wrappers").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.failure import BackwardTransaction, Discard
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-008",
    [
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a+b-1-held-discard]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-after-writing-a+b-2-held-discard]",
    ],
)


class CallerOnly(BackwardTransaction):
    def __init__(self, windows: Sequence[Sequence[torch.Tensor]], caller: int) -> None:
        super().__init__(windows, keep=False)
        self.caller = caller

    @override
    def fail(self) -> list[int]:
        if not self.written(self.caller):
            return []
        for tensor in self.windows[self.caller]:  # the defect: the other windows it wrote into are left as they are
            tensor.grad = None
        return [self.caller]


class Policy(Discard):
    caller = 0

    @override
    def begin_backward(self, windows: Sequence[Sequence[torch.Tensor]]) -> BackwardTransaction:
        return CallerOnly(windows, self.caller)


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.failure.name == "discard":
            self.parts.failure = Policy()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if self.parts.failure.name == "discard":
            self.parts.failure = Policy()

    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if isinstance(self.parts.failure, Policy):
            self.parts.failure.caller = wrapper.window_index
        super().backward(wrapper, loss, *args, **kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a failed backward discards the calling wrapper's window only")
