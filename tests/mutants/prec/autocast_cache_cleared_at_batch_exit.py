"""PREC-004 broken, half-fixed: the weight cache stays on, and the context clears it when a ``batch()`` block ends.

A framework that noticed stale casts across iterations and clears autocast's cache at each iteration's end: a
forward after a real step inside the same iteration's region still uses the casts made before the step.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling, LossScaling, NoLossScaling
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import BF16_MIXED, Mutant

MUTANT = Mutant("PREC-004", ["test_gan_iteration_in_one_autocast_region"], cells=BF16_MIXED)


class _ClearsCacheAtTheEnd(LossScaling):
    """The end of an iteration clears autocast's cache first."""

    @override
    def end_iteration(self, windows: Sequence[Window], parallel: DataParallel) -> None:
        torch.clear_autocast_cache()
        super().end_iteration(windows, parallel)


class _Unscaled(_ClearsCacheAtTheEnd, NoLossScaling):
    pass


class _Scaled(_ClearsCacheAtTheEnd, GradScaling):
    pass


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scaler = self.parts.scaling.scaler
        self.parts.scaling = _Unscaled() if scaler is None else _Scaled(scaler)

    @override
    def autocast(self) -> AbstractContextManager[None]:
        dtype = self.parts.precision.autocast_dtype
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
