"""ZERO-005 broken: when the loss scale changes, the gradients a taken step left are rescaled like an open window's.

They are what the step applied, unscaled: the next window that carries them applies them halved after a back-off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-005",
    [
        "test_the_carried_part_is_neither_unscaled_nor_rescaled_again",
        "test_a_window_applies_what_it_carries_plus_its_own_mean",
        ORACLE_PROPERTY,
    ],
    cells=F16,
)


class RescalesLeft(GradScaling):
    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        if any(window.stage is WindowStage.PREPARED for window in windows):
            return
        self.update(tensor for window in windows for tensor in parallel.window_tensors(window))


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = RescalesLeft(self.parts.scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
