"""ERR-002 broken: the LBFGS path returns before the argument checks (ERR-001 and ERR-002).

Like a wrapper with an early ``if isinstance(optimizer, LBFGS): return optimizer.step(closure)``: a
``make_optimizer_step`` that is not a bool is read as a truth value (``"yes"`` steps, ``0`` is refused as
accumulation with a ``ValueError``), and a non-callable closure reaches LBFGS, whose step starts before it fails.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _check_step_arguments(
        self, index: int, closure: object, make_optimizer_step: object, kwargs: dict[str, Any]
    ) -> None:
        if not self._slots[index].evaluates_closure:
            super()._check_step_arguments(index, closure, make_optimizer_step, kwargs)

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        if slot.evaluates_closure and make_optimizer_step is not None:
            return bool(make_optimizer_step)  # read as a truth value
        return super()._closes_window(slot, make_optimizer_step)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
