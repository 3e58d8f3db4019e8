"""PREC-002 broken: 16-true skips a real step whose gradients are not finite, as 16-mixed's loss scaler does.

float16 overflows easily, so the implementer guards every float16 precision with the scaler's found-inf rule and
reports ``SKIPPED_NON_FINITE``. PREC-002: no loss scaler in 16-true, and never a skipped step; the step applies what
the window holds, as a plain float16 loop does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import NoLossScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16_TRUE, Mutant

MUTANT = Mutant("PREC-002", ["test_16_true_has_no_autocast_no_loss_scaling_and_never_skips"], cells=F16_TRUE)


class _FoundInfSkips(NoLossScaling):
    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if not all(bool(torch.isfinite(grad).all()) for grad in grads):
            return False
        step(**kwargs)
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.precision == "16-true":
            self.parts.scaling = _FoundInfSkips()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
