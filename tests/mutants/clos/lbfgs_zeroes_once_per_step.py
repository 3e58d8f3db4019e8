"""CLOS-004 broken: an LBFGS step zeroes the gradients once, before its first evaluation, not before each one.

As a training loop that calls ``optimizer.zero_grad()`` once per step and leaves the rest to the closure (Lightning's
automatic optimization before its closure took over the zeroing): with a closure that does not zero, each of
LBFGS's later evaluations adds its gradients to the previous ones', so the line search and the curvature pairs see
sums of gradients of other points. A single evaluation (``max_iter=1``) or a closure that zeroes hides it.
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


MUTANT = Mutant("CLOS-004", ["test_lbfgs_evaluations_see_only_their_own_gradients"])

T = TypeVar("T")


class ZeroesOncePerStep(Closures):
    def __init__(self) -> None:
        self.zeroed_in: Call | None = None
        """The step call whose first evaluation zeroed the gradients."""

    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        window = context.windows[index]
        call.advance(CallStage.REEVALUATING)
        if self.zeroed_in is not call:
            self.zeroed_in = call
            window.optimizer.zero_grad(set_to_none=True)
        loss = context.run_closure(call, index, closure)
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = ZeroesOncePerStep()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
