"""AMP-005 broken: LBFGS under 16-mixed is refused only after its closure ran.

The check sits in the step, after the first evaluation (as where the precision plugin only looks at the
closure's result): the ``TypeError`` comes, but the user's forward and backward pass already ran.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import mutant_info
from mutants._declared import F16, Mutant
from mutants.amp.lbfgs_accepted_under_16_mixed import Context as AcceptsLbfgs

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("AMP-005", ["test_lbfgs_is_refused_under_16_mixed"], cells=F16)

T = TypeVar("T")


class _RefusedAfterTheEvaluation(Closures):
    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        loss = super().evaluate(context, call, index, closure)
        if context.scaler is not None:
            name = type(context.windows[index].optimizer).__name__
            raise TypeError(f"{name} evaluates its closure itself, which loss scaling cannot follow")
        return loss


class Context(AcceptsLbfgs):
    """Wraps LBFGS under 16-mixed as the accepting mutant does, then refuses it in the step."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = _RefusedAfterTheEvaluation()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
