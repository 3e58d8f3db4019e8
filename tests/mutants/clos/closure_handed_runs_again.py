"""CLOS-001 broken: the closure handed to the inner optimizer runs the call's closure again on its first call.

As a wrapper that passes the user's closure straight through to ``optimizer.step(closure)`` after running it
itself: each real step runs the closure twice, and the second run's gradients (of the last micro-batch alone)
replace the window's mean.
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


MUTANT = Mutant("CLOS-001", ["test_a_real_step_hands_the_inner_optimizer_the_closure"])

T = TypeVar("T")


class EvaluatesEveryCall(Closures):
    @override
    def replay(
        self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T], result: T
    ) -> Callable[[], T]:
        return lambda: self.evaluate(context, call, index, closure)  # the first call too: the window is replaced


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = EvaluatesEveryCall()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
