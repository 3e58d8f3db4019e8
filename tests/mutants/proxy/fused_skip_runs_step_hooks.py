"""PROXY-004 broken: a fused optimizer's skipped step still runs its inner ``step``, so its step hooks fire.

As a precision plugin that hands every real step to ``scaler.step(optimizer)`` (Lightning's ``MixedPrecision``,
a plain ``GradScaler`` loop): ``GradScaler`` calls a fused optimizer's ``step`` even when the gradients are not
finite, passing ``found_inf`` for its kernel to skip the update inside, and ``Optimizer.step``'s hooks run around
it. The step is reported as skipped, and the parameters stay as they were; only the hooks say it was taken.
Non-fused optimizers are unaffected: ``GradScaler`` does not call their ``step`` on an overflow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("PROXY-004", ["test_step_hooks_do_not_fire_on_skipped_steps[fused]"], cells=F16)


class ScalerStepsEverything(GradScaling):
    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        has_gradients = any(p.grad is not None for group in optimizer.param_groups for p in group["params"])
        if not torch_compat.steps_through_inf(optimizer) or not has_gradients:
            return super().step(optimizer, step, kwargs)
        self.scaler.step(optimizer, **kwargs)  # a fused step runs (and its hooks fire) even on non-finite gradients
        self.stepped_since_update = True
        return not torch_compat.found_inf(self.scaler, optimizer)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = ScalerStepsEverything(self.parts.scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
