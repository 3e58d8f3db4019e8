"""PREC-002 broken: 16-true scales the loss by a static 1024 and unscales the gradients before the inner step.

Apex's and the old fp16 recipes' static loss scale, kept for float16 weights so that small gradients underflow less:
``wrapper.backward`` propagates ``1024 * loss``. PREC-002: 16-true has no loss scaler; the gradients a backward
leaves are the true ones.
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

_SCALE = 1024.0


class _StaticScaling(NoLossScaling):
    @override
    def scale(self, loss: torch.Tensor, window: int) -> torch.Tensor:
        return loss * _SCALE

    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        with torch.no_grad():
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if param.grad is not None:
                        param.grad.div_(_SCALE)
        step(**kwargs)
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.precision == "16-true":
            self.parts.scaling = _StaticScaling()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
