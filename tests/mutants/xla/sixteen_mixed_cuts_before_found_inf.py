"""XLA-001 broken: a 16-mixed real step on XLA cuts the graph before the scaler reads its found-inf.

Like an author following torch_xla's advice to ``xm.mark_step()`` before a value goes to the host: ``GradScaler``
reads found-inf with ``.item()`` in its step, so the step cuts the graph between unscaling and the inner step,
and once more after it; every 16-mixed real step, taken or skipped for non-finite gradients, then cuts the graph
twice. Other precisions, and the parameters, stay right.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.amp import GradScaling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA_F16, Mutant

MUTANT = Mutant(
    "XLA-001", ["test_each_window_is_reduced_once_and_a_skipped_step_cuts_once"], cells=XLA_F16, blind="batch 2"
)


class SyncBeforeFoundInf(GradScaling):
    @override
    def step(self, optimizer: torch.optim.Optimizer, step: Callable[..., Any], kwargs: dict[str, Any]) -> bool:
        import torch_xla

        torch_xla.sync()  # materialise the found-inf that GradScaler.step reads with .item()
        return super().step(optimizer, step, kwargs)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        scaling = self.parts.scaling
        if self.device.type == "xla" and type(scaling) is GradScaling:
            self.parts.scaling = SyncBeforeFoundInf(scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
