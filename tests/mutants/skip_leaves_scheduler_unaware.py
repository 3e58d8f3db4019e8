"""SCHED-002 broken: after a skipped first step, a scheduler built on the inner optimizer warns.

``GradScaler.step`` skips the inner ``optimizer.step``, so the scheduler's patched step never records a call and
``scheduler.step()`` warns that it ran before ``optimizer.step()`` (PyTorch issue 67590, Lightning 5558).
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_real_step(self, slot: Slot) -> None:
        recorded = "_opt_called" in vars(slot.optimizer)
        super()._finish_real_step(slot)
        if not recorded:
            vars(slot.optimizer).pop("_opt_called", None)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
