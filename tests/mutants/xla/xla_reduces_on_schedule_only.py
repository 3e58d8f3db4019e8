"""XLA-001 broken: the gradients are reduced only on real steps that the accumulation schedule foresees.

The reduction is tied to the schedule (``(batch_idx + 1) % accumulate_grad_batches == 0``), as a DDP-style
``require_backward_grad_sync`` flag decided by the loop would be: a window cut short by ``make_optimizer_step=True``
and the partial last window flushed by the epoch's last batch are stepped on each replica's own gradients.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.preparation import PreparationStep, Reduction
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA, Mutant

MUTANT = Mutant(
    "XLA-001",
    ["test_one_reduction_per_window_after_its_last_backward", "test_one_reduction_per_window_then_clipping"],
    cells=XLA,
)


class ReductionOnSchedule(Reduction):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        position = context.windows.position
        if position is None or (position.batch_idx + 1) % context.accumulate_grad_batches == 0:
            super().__call__(context, window)


def _on_schedule(step: PreparationStep) -> PreparationStep:
    return ReductionOnSchedule() if isinstance(step, Reduction) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_on_schedule, preparation.steps)),
            evaluation=tuple(map(_on_schedule, preparation.evaluation)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
