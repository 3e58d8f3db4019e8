"""AMP-006 broken: open windows are rescaled when the loss scale backs off, but not when it grows.

An implementation written against the overflow case only ("after a skip the scale halves: halve the open windows"):
when the scale grows (every ``growth_interval`` iterations without an overflow) the open window keeps gradients
scaled by the old scale beside new ones scaled by the new scale, and its real step unscales all of them by the new
one. With torch's default ``growth_interval=2000`` no short run grows the scale.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, ORACLE_PROPERTY, Mutant

MUTANT = Mutant("AMP-006", ["test_open_window_across_scale_growth_and_back_off", ORACLE_PROPERTY], cells=F16)


class _BackOffOnly(GradScaling):
    @override
    def update(self, open_windows: Iterable[torch.Tensor]) -> None:
        if not self.stepped_since_update:
            return
        self.stepped_since_update = False
        grads = [param.grad for param in open_windows if param.grad is not None]
        old = self.scaler.get_scale()
        self.scaler.update()
        new = self.scaler.get_scale()
        if new < old:
            with torch.no_grad():
                for grad in grads:
                    grad.mul_(new / old)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.scaler is not None:
            self.parts.scaling = _BackOffOnly(self.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
