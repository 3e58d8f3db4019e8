"""SCHED-002 broken: a skipped step is hidden from the scheduler by clearing ``_opt_called``.

Meant to keep the schedule in line with the steps really taken; the scheduler's next ``step()`` then warns that
it ran before ``optimizer.step()``, whether it was built on the wrapper or on the inner optimizer.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("SCHED-002", ["test_skipped_step_does_not_make_a_scheduler_warn"], cells=F16)


class _SkipUnmarked(Accumulation):
    @override
    def closed(self, window: Window, *, skipped: bool) -> None:
        super().closed(window, skipped=skipped)
        if skipped:
            window.optimizer._opt_called = False  # type: ignore[attr-defined]


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = _SkipUnmarked(self.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
