"""SCHED-002 broken: after a skipped first step, a scheduler built on the inner optimizer warns.

``GradScaler.step`` skips the inner ``optimizer.step``, so the scheduler's patched step never records a call and
``scheduler.step()`` warns that it ran before ``optimizer.step()`` (PyTorch issue 67590, Lightning 5558).
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("SCHED-002", ["test_skipped_step_does_not_make_a_scheduler_warn[inner]"], cells=F16)


class _SchedulerUnaware(Accumulation):
    @override
    def closed(self, window: Window, *, skipped: bool) -> None:
        recorded = "_opt_called" in vars(window.optimizer)
        super().closed(window, skipped=skipped)
        if not recorded:
            vars(window.optimizer).pop("_opt_called", None)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = _SchedulerUnaware(self.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
