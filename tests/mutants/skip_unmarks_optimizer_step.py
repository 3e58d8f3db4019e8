"""SCHED-002 broken: a skipped step is hidden from the scheduler by clearing ``_opt_called``.

Meant to keep the schedule in line with the steps really taken; the scheduler's next ``step()`` then warns that
it ran before ``optimizer.step()``, whether it was built on the wrapper or on the inner optimizer.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class _SkipUnmarked(Accumulation):
    def closed(self, window: Window, *, skipped: bool) -> None:
        super().closed(window, skipped=skipped)
        if skipped:
            window.optimizer._opt_called = False  # type: ignore[attr-defined]


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = _SkipUnmarked(self.accumulate_grad_batches)

    @property
    def accumulate_grad_batches(self) -> int:
        return self.parts.accumulation.every

    @accumulate_grad_batches.setter
    def accumulate_grad_batches(self, value: int) -> None:
        # The reference's setter, rebuilding this accumulation rule rather than the reference's.
        value = _SkipUnmarked(value).every
        if value != self.parts.accumulation.every:
            self.parts.refusals.check_accumulation_change(self, value)
            self.parts.accumulation = _SkipUnmarked(value)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
