"""ZERO-005 broken: when the loss scale changes, the carried part of an open window is rescaled with its own gradients.

The carried gradients are unscaled already; a back-off halves them, a growth doubles them, as if they were scaled.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant(
    "ZERO-005", ["test_the_carried_part_is_neither_unscaled_nor_rescaled_again", ORACLE_PROPERTY], cells=F16
)


class RescalesCarried(GradScaling):
    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        old = self.scaler.get_scale()
        super().end_iteration(windows, parallel)
        new = self.scaler.get_scale()
        if new != old:
            with torch.no_grad():
                for window in windows:
                    for grad in (window.carried or {}).values():
                        grad.mul_(new / old)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = RescalesCarried(self.parts.scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
