"""CLOS-004 broken: when the inner optimizer evaluates the closure again, the gradients are not cleared first.

A two-pass optimizer's second gradient is then the sum of both points' gradients (a closure written for
Lightning does not zero): SAM steps with the wrong gradient.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call, CallStage
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CLOS-004", ["test_a_two_pass_optimizer_evaluates_the_closure_again"])

T = TypeVar("T")


class ReevaluatesWithoutClearing(Closures):
    @override
    def replay(
        self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T], result: T
    ) -> Callable[[], T]:
        calls = 0

        def evaluate() -> T:
            nonlocal calls
            calls += 1
            if calls == 1 or call.stage is not CallStage.STEPPING:
                return result
            call.advance(CallStage.REEVALUATING)
            loss = context.run_closure(call, index, closure)  # into the gradients of the first point
            context.parts.preparation.prepare_evaluation(context, context.windows[index])
            call.advance(CallStage.STEPPING)
            return loss

        return evaluate


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = ReevaluatesWithoutClearing()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
