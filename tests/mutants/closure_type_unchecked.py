"""ERR-001 broken: no up-front type check of the closure; a non-callable one fails only when it is called.

The closure runs before anything else changes, so the ``TypeError`` Python raises (``'int' object is not
callable``) leaves the window as it was: no check catches this (``UNCAUGHT`` in ``tests/test_mutants.py``).
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_step_arguments(self, closure: object, make_optimizer_step: object) -> None:
        super()._check_step_arguments(None, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
