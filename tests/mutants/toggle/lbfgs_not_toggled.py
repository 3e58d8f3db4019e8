"""TOGGLE-001 broken: the evaluations of a closure-evaluating optimizer (LBFGS) are not toggled.

The first-order path toggles around the closure, but the LBFGS path hands LBFGS a closure that only enters the
autocast region: inside every evaluation the other optimizers' parameters still require grad, so LBFGS's
backward passes write into their gradients (an open window of another optimizer included).
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


MUTANT = Mutant("TOGGLE-001", ["test_lbfgs_beside_another_optimizer"])

T = TypeVar("T")


class UntoggledEvaluations(Closures):
    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        window = context.windows[index]
        call.advance(CallStage.REEVALUATING)
        window.optimizer.zero_grad(set_to_none=True)
        with context.autocast():  # not toggled
            loss = closure()
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = UntoggledEvaluations()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
