"""ERR-002 broken: the LBFGS path returns before the argument checks (ERR-001 and ERR-002).

Like a wrapper with an early ``if isinstance(optimizer, LBFGS): return optimizer.step(closure)``: a
``make_optimizer_step`` that is not a bool is read as a truth value (``"yes"`` steps, ``0`` is refused as
accumulation with a ``ValueError``), and a non-callable closure reaches LBFGS, whose step starts before it fails.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    _lbfgs_call = False

    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        self._lbfgs_call = self._slots[index].evaluates_closure
        try:
            return super()._step(index, closure, make_optimizer_step, kwargs)
        finally:
            self._lbfgs_call = False

    def _check_step_arguments(self, closure: object, make_optimizer_step: object) -> None:
        if not self._lbfgs_call:
            super()._check_step_arguments(closure, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
