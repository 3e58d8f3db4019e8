"""AMP-006 broken: a window left open across a change of the loss scale is not rescaled.

The scale backs off after another optimizer's overflow; the open window keeps gradients scaled by the old scale
next to new ones scaled by the new scale, and its real step unscales all of them by the new one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("AMP-006", ["test_open_window_survives_a_scale_change", ORACLE_PROPERTY], cells=F16)


class _NoRescaling(GradScaling):
    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        self.update(())


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _NoRescaling(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
