"""ZERO-005 broken (with CLOS-004): LBFGS's first evaluation of a real step starts from the left gradients.

Reasoning: "a window starts from what the last step left" applied to closure evaluators too; the implementer clears
the gradients before each *re*-evaluation (CLOS-004's "each evaluation starts from cleared gradients" read as
"between evaluations") and lets the first evaluation start from the window as it is. Under the default
``zero_grad_after_step=True`` the gradients are ``None`` at that point, so nothing changes; under ``False`` a loop that
does not call ``zero_grad()`` between LBFGS steps feeds LBFGS ``g_last + g`` as its first gradient. ZERO-005: "An
optimizer that evaluates its closure itself carries nothing (CLOS-004)".
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


MUTANT = Mutant("ZERO-005", ["test_an_optimizer_that_evaluates_its_closure_carries_nothing"], blind="batch 3")

T = TypeVar("T")


class _ClearsBetweenEvaluations(Closures):
    _evaluating: Call | None = None
    """The call whose first evaluation ran (each later one of it starts from cleared gradients)."""

    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        window = context.windows[index]
        if not window.evaluates_closure:
            return super().evaluate(context, call, index, closure)  # a replayed closure's re-evaluation [CLOS-005]
        if self._evaluating is call:
            window.clear_gradients()  # a re-evaluation starts from cleared gradients
        self._evaluating = call
        call.advance(CallStage.REEVALUATING)
        loss = context.run_closure(call, index, closure)
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss

    @override
    def __getstate__(self) -> dict[str, Any]:
        return {}


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = _ClearsBetweenEvaluations()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
