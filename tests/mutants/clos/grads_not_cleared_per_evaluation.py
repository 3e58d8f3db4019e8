"""CLOS-004 broken: an evaluating optimizer's gradients are cleared before its first evaluation only.

The implementer clears the window once when the real step begins and leaves later evaluations to the closure,
as torch's LBFGS documentation asks closures to zero their gradients. A closure written for Lightning's automatic
optimization does not zero them, so from the second evaluation on LBFGS sees gradients summed over evaluations.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import CallStage
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "CLOS-004",
    [
        "test_hooks_of_an_evaluating_optimizer_run_once_per_real_step[class attribute]",
        "test_hooks_of_an_evaluating_optimizer_run_once_per_real_step[instance attribute]",
    ],
    blind="batch 1",
)

T = TypeVar("T")


class ClearOnceClosures(Closures):
    def __init__(self) -> None:
        self.cleared_for: tuple[int, int] | None = None

    @override
    def evaluate(self, context: Any, call: Any, index: int, closure: Callable[[], T]) -> T:
        window = context.windows[index]
        call.advance(CallStage.REEVALUATING)
        key = (index, window.steps)
        if self.cleared_for != key:  # the defect: only the step's first evaluation starts from cleared gradients
            window.optimizer.zero_grad(set_to_none=True)
            self.cleared_for = key
        loss: T = context.run_closure(call, index, closure)
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = ClearOnceClosures()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
