"""AMP-003 broken: the loss scaler is updated right after every real step, also inside ``batch()``.

torch's AMP examples call ``scaler.step(opt); scaler.update()`` together, and with one optimizer per iteration that
is exactly AMP-003; the implementer keeps the pair for each optimizer. With two optimizers in one block, an
overflow of the first halves the scale before the second steps, and the second's gradients, made at the old scale,
are unscaled by the new one (twice too large).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("AMP-003", ["test_overflow_in_one_optimizer_skips_only_that_one"], cells=F16, blind="batch 1")


class _StepThenUpdate(GradScaling):
    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        taken = super().step(optimizer, step, kwargs)
        self.update(())  # the recipe's scaler.update() after scaler.step()
        return taken


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = _StepThenUpdate(self.parts.scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
