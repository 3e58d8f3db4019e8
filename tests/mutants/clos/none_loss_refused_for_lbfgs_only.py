"""CLOS-002 broken: a closure returning ``None`` is refused for torch's ``LBFGS`` only, not for an optimizer that
declares ``evaluates_closure``.

The check that a closure evaluated by the optimizer itself returned the loss is written as
``isinstance(optimizer, torch.optim.LBFGS)``: torch's LBFGS is the optimizer that crashes on ``float(None)``, so that
is where the implementer put the clear ``TypeError``. An optimizer that declares ``evaluates_closure = True`` is
treated as LBFGS everywhere else, but its ``None`` loss goes through: the step runs, the parameters move, and the call
that the contract refuses ("the call changes nothing") returns as if it were fine.

Plausible: the sentence was added because LBFGS failed with torch's own error; CLOS-002's "whatever declares it, every
such optimizer is treated alike" is easy to forget when the motivating case is one class.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference.call import Call, CallStage
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F64, Mutant

MUTANT = Mutant(
    "CLOS-002",
    [
        "test_an_evaluating_optimizers_closure_must_return_the_loss[first-evaluation-class attribute]",
        "test_an_evaluating_optimizers_closure_must_return_the_loss[second-evaluation-instance attribute]",
    ],
    cells=F64,
    blind="batch 4",
)

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

T = TypeVar("T")


class LBFGSOnlyClosures(Closures):
    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        window = context.windows.all[index]
        call.advance(CallStage.REEVALUATING)
        window.clear_gradients()
        loss = context.run_closure(call, index, closure)
        if loss is None and isinstance(window.optimizer, torch.optim.LBFGS):  # the defect: LBFGS only
            raise TypeError(
                "LBFGS evaluates the closure itself and needs the loss it returns, but the closure returned None: "
                "end the closure with `return loss`; nothing was changed"
            )
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss


class Context(MutantContext):
    @override
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = LBFGSOnlyClosures()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "CLOS-002: a closure returning None is refused for LBFGS only")
