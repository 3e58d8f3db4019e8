"""CLOS-005 broken: the inner optimizer's own evaluations of the closure run outside the autocast region.

The first evaluation is the context's (``run_closure``, inside autocast); further ones are made by the inner
optimizer from its ``step``, and the implementer runs them as plain calls (toggled, gradients cleared, prepared),
reasoning that the optimizer step is not a forward pass. Under bf16-mixed a two-pass optimizer's second point is then
evaluated in float32, another precision than its first (LBFGS in 32-true is unaffected).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import CallStage
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant(
    "CLOS-005", ["test_reevaluations_run_in_the_autocast_region_and_may_backward"], cells=BF16_MIXED, blind="batch 1"
)

T = TypeVar("T")


class PlainEvaluations(Closures):
    @override
    def evaluate(self, context: Any, call: Any, index: int, closure: Callable[[], T]) -> T:
        window = context.windows[index]
        call.advance(CallStage.REEVALUATING)
        window.optimizer.zero_grad(set_to_none=True)
        with context.parts.toggling.region(context, index, sync_grad=call.real):
            loss = closure()  # the defect: no autocast region
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = PlainEvaluations()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
