"""CLOS-002 broken: a closure returning ``None`` to an optimizer that evaluates it itself raises ``ValueError``, not
``TypeError``.

The refusal is there, with the right message, before anything changes, but of the wrong class: the implementer
reads "the closure returned a bad value" and picks ``ValueError``. A framework (or test) that catches ``TypeError``
for "the closure's result is not a loss", as torch's own ``float(None)`` raised before the contract named the error,
no longer catches it.

Plausible: ``ValueError`` versus ``TypeError`` for a wrong return value is a coin toss for many authors, and the
contract's other closure refusals (accumulating an LBFGS) are ``ValueError``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call, CallStage
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

MUTANT = Mutant("CLOS-002", ["test_an_evaluating_optimizers_closure_must_return_the_loss"], cells=F64, blind="batch 4")

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

T = TypeVar("T")


class ValueErrorClosures(Closures):
    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        window = context.windows.all[index]
        call.advance(CallStage.REEVALUATING)
        window.clear_gradients()
        loss = context.run_closure(call, index, closure)
        if loss is None and window.evaluates_closure:
            name = type(window.optimizer).__name__
            raise ValueError(  # the defect: ValueError, where the contract says TypeError
                f"{name} evaluates the closure itself and needs the loss it returns, but the closure returned None: "
                "end the closure with `return loss` (after opt.backward(loss)); nothing was changed"
            )
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = ValueErrorClosures()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "CLOS-002: a closure returning None raises ValueError")
