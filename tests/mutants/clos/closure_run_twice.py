"""CLOS-001 broken: on a real step the closure runs, then is passed to the inner ``step`` which runs it again.

The ``optimizer.step(closure=closure)`` of frameworks whose precision plugin has already evaluated it: the closure
the inner optimizer gets runs the user's closure on its first call too, and its backward adds the last
micro-batch's gradients to the prepared window once more.
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


MUTANT = Mutant("CLOS-001", ["test_closure_runs_once_per_call"])

T = TypeVar("T")


class RunsTheClosureAgain(Closures):
    @override
    def replay(
        self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T], result: T
    ) -> Callable[[], T]:
        def run_again() -> T:
            call.advance(CallStage.REEVALUATING)  # a backward is let through, into the prepared window
            try:
                return context.run_closure(call, index, closure)
            finally:
                call.advance(CallStage.STEPPING)

        return run_again


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.closures = RunsTheClosureAgain()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
