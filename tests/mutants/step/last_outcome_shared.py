"""STEP-004 broken: one ``last_outcome`` for the whole context, the last call's, whichever wrapper made it.

A framework that keeps "what the last step did" on its training loop rather than on each optimizer: reading the
generator's outcome after the discriminator's call gives the discriminator's.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("STEP-004", [ORACLE_PROPERTY])

T = TypeVar("T")


class Wrapper(WrappedOptimizer[Any]):
    @property
    @override
    def last_outcome(self) -> StepOutcome | None:
        context = self.training_context
        assert isinstance(context, Context)
        return context.shared_outcome

    @override
    def step(  # type: ignore[override]
        self, closure: Callable[[], T] | None = None, make_optimizer_step: bool | None = None, **kwargs: Any
    ) -> T | None:
        context = self.training_context
        assert isinstance(context, Context)
        try:
            return super().step(closure, make_optimizer_step, **kwargs)
        finally:
            context.shared_outcome = context.windows[self.window_index].last_outcome


class Context(MutantContext):
    shared_outcome: StepOutcome | None = None

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
