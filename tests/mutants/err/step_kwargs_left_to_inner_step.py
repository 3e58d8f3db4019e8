"""ERR-008 broken: ``step`` keyword arguments are not checked against the inner step's signature.

They are handed to the inner optimizer's ``step`` as they are, so a misspelt keyword is dropped without a word on a
call that only accumulates, and fails only on the real step, after the closure ran (Lightning's ``**kwargs``
pass-through).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("ERR-008", ["test_step_kwargs_the_inner_step_cannot_take"])


class KwargsUncheckedRefusals(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        super().check_step(context, window, closure, make_optimizer_step, {})


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = KwargsUncheckedRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
