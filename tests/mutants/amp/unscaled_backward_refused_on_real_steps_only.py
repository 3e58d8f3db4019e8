"""AMP-008 broken, half-fixed: an unscaled backward is refused in a closing step's closure only.

A framework that checks the gradients where it unscales them, at the real step: a micro-step's unscaled gradients
are accumulated into the window without a word and divided by the loss scale later.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-008",
    [
        "test_unscaled_backward_in_a_closure_is_refused[discard-loss.backward()-accumulating]",
        "test_unscaled_backward_in_a_closure_is_refused[discard-torch.autograd.backward-accumulating]",
        "test_unscaled_backward_in_a_closure_is_refused[restore-loss.backward()-accumulating]",
        "test_unscaled_backward_in_a_closure_is_refused[restore-torch.autograd.backward-accumulating]",
    ],
    cells=F16,
)

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        if call.real:
            return super().run_closure(call, index, closure)
        with self.parts.toggling.region(self, index, sync_grad=call.real), self.autocast():
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
