"""ERR-008 broken: ``step`` keyword arguments are not checked against the inner step's signature.

They are handed to the inner optimizer's ``step`` as they are, so a misspelt keyword is dropped without a word on a
call that only accumulates, and fails only on the real step, after the closure ran (Lightning's ``**kwargs``
pass-through).
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        super()._check_step_arguments(index, closure, make_optimizer_step, {})


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
