"""ERR-001 broken: no up-front type check of the closure; a non-callable one fails only when it is called.

The ``TypeError`` Python raises when the closure is called (``'int' object is not callable``) leaves the window as
it was; but a call that the window's stage refuses as well (``make_optimizer_step=False`` after
``unscale_gradients()``) now gets the stage's ``RuntimeError`` instead: the argument is no longer checked first.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        super()._check_step_arguments(index, None, make_optimizer_step, kwargs)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
