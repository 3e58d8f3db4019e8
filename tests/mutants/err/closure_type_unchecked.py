"""ERR-001 broken: no up-front type check of the closure; a non-callable one fails only when it is called.

The ``TypeError`` Python raises when the closure is called (``'int' object is not callable``) leaves the window as
it was; but a call that the window's stage refuses as well (``make_optimizer_step=False`` after
``unscale_gradients()``) now gets the stage's ``RuntimeError`` instead: the argument is no longer checked first.
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


MUTANT = Mutant("ERR-001", ["test_non_callable_closure"])


class ClosureUncheckedRefusals(Refusals):
    @override
    def check_step(
        self, context: TrainingContext, window: Window, closure: object, make_optimizer_step: object, kwargs: Any
    ) -> None:
        super().check_step(context, window, None, make_optimizer_step, kwargs)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = ClosureUncheckedRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
