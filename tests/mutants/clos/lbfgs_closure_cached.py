"""CLOS-002 broken: LBFGS gets a closure that was evaluated once and returns the cached loss every time.

LBFGS then line-searches on stale gradients and a stale loss instead of re-evaluating the model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CLOS-002", ["test_lbfgs_evaluates_the_closure_itself"])

T = TypeVar("T")


class EvaluatesOnce(Closures):
    def __init__(self) -> None:
        self.cached: tuple[Call, Any] | None = None

    @override
    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        if self.cached is None or self.cached[0] is not call:
            self.cached = (call, super().evaluate(context, call, index, closure))
        result: T = self.cached[1]  # the first evaluation's loss, whatever LBFGS changed since
        return result


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = EvaluatesOnce()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
