"""PREC-002 broken: 16-true skips a real step whose gradients are not finite, as 16-mixed does.

Reasoning: float16 weights overflow easily, and a step with ``inf`` gradients would ruin them; since the 16-mixed path
already detects non-finite gradients and reports ``SKIPPED_NON_FINITE``, the implementer gives 16-true the same guard
(without a scaler: a plain ``isfinite`` over the gradients). A finite run, every casual test, is unaffected. PREC-002:
bf16-true and 16-true have no loss scaler, and "a 16-true step is never skipped": the inner optimizer steps whatever
the gradients are, as Lightning's 16-true does.
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

MUTANT = Mutant(
    "PREC-002", ["test_16_true_has_no_autocast_no_loss_scaling_and_never_skips"], cells=F16_TRUE, blind="batch 3"
)


class _GuardedHalfStep(NoLossScaling):
    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        if grads and not all(bool(torch.isfinite(grad).all()) for grad in grads):
            return False  # float16 weights would become inf/nan: skip, as 16-mixed skips
        step(**kwargs)
        return True


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.parts.precision.name == "16-true":
            self.parts.scaling = _GuardedHalfStep()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
