"""ACC-001 broken: the window's gradients are divided by ``accumulate_grad_batches``, not by its real length.

Right for full windows; wrong for one cut short by ``make_optimizer_step=True`` or flushed at the epoch's end.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.preparation import PreparationStep, WindowMean
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ACC-001", ["test_window_cut_short_applies_its_own_mean", "test_schedule_flushes_last_partial_window"])


class NominalWindowMean(WindowMean):
    @override
    def changes(self, context: TrainingContext, window: Window) -> bool:
        return context.accumulate_grad_batches != 1

    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        normalise_window(window.params(), context.accumulate_grad_batches)


def _nominal(step: PreparationStep) -> PreparationStep:
    return NominalWindowMean() if isinstance(step, WindowMean) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = type(preparation)(
            steps=tuple(map(_nominal, preparation.steps)), evaluation=preparation.evaluation
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
