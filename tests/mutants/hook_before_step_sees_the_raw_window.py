"""HOOK-002 broken: ``before_optimizer_step`` runs before the window's preparation, not after it.

As a framework hook fired at the top of the optimizer step: a gradient-norm or NaN check sees the window's sum,
still scaled under 16-mixed, instead of the unscaled mean the step applies.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _prepare_gradients(self, slot: Slot) -> None:
        index = self._slots.index(slot)
        if self._hooks.before_optimizer_step:
            self._hooks.run_before_optimizer_step(self._new_wrapper(index))
        super()._prepare_gradients(slot)

    def _before_optimizer_step(self, index: int, wrapper: Any) -> None:
        return


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
