"""SCHED-001 broken: a call that only accumulates marks the inner optimizer as stepped for its LR scheduler.

As a wrapper that sets ``_opt_called`` on every call to keep torch's "``lr_scheduler.step()`` before
``optimizer.step()``" warning quiet under accumulation (the marking a skipped step needs, applied to every call):
a per-step scheduler built on the inner optimizer and stepped after each micro-step then runs ahead of the real
steps without the warning torch gives a plain loop that does so.
"""

from __future__ import annotations

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, Slot, mutant_info


class Context(MutantContext):
    def _finish_accumulation(self, slot: Slot) -> None:
        super()._finish_accumulation(slot)
        torch_compat.mark_stepped_for_scheduler(slot.optimizer)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
