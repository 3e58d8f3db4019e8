"""AMP-004 broken: a step that the scaler skipped for non-finite gradients is reported as ``STEPPED``.

The framework reads "the inner step was called" as "the optimizer stepped", as a loop that ignores
``GradScaler``'s found-inf does: ``last_outcome`` and the step count claim a step that never happened.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "AMP-004",
    [
        "test_overflow_in_one_optimizer_skips_only_that_one",
        "test_skipped_step_does_not_make_a_scheduler_warn",
        "test_skip_with_fused_and_foreach_adam",
    ],
    cells=F16,
)


class _SkipReportedAsStepped(Accumulation):
    @override
    def closed(self, window: Window, *, skipped: bool) -> None:
        super().closed(window, skipped=skipped)
        if skipped:
            window.steps += 1
            window.last_outcome = StepOutcome.STEPPED


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = _SkipReportedAsStepped(self.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
