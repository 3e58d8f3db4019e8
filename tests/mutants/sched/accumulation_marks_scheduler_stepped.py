"""SCHED-001 broken: a call that only accumulates marks the inner optimizer as stepped for its LR scheduler.

As a wrapper that sets ``_opt_called`` on every call to keep torch's "``lr_scheduler.step()`` before
``optimizer.step()``" warning quiet under accumulation (the marking a skipped step needs, applied to every call):
a per-step scheduler built on the inner optimizer and stepped after each micro-step then runs ahead of the real
steps without the warning torch gives a plain loop that does so.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("SCHED-001", ["test_scheduler_warns_after_accumulating_calls_as_torch_does[inner]"])


class _MarksEveryCall(Accumulation):
    @override
    def accumulated(self, window: Window) -> None:
        super().accumulated(window)
        torch_compat.mark_stepped_for_scheduler(window.optimizer)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = _MarksEveryCall(self.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
