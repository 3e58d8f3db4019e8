"""ERR-010 broken: ``wrap`` checks only the context's own optimizers; another live context may wrap one again.

Two contexts then keep two windows and two loss scalers over the same gradients (each zeroes and steps them on its
own schedule).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference import refusals as reference_refusals
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-010", ["test_wrap_of_an_optimizer_another_context_wraps"])


class OwnListRefusals(Refusals):
    @override
    def check_wrap(self, context: TrainingContext, optimizer: object) -> None:
        if not isinstance(optimizer, WrappedOptimizer):
            owners: Any = reference_refusals.WRAPPED_BY
            owners.pop(optimizer, None)  # no registry across contexts: only this context's list is consulted
        super().check_wrap(context, optimizer)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = OwnListRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
