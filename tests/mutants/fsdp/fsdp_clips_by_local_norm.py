"""FSDP-003 broken: clipping by norm takes each rank's norm of its own shards, not the global norm.

As a loop that runs ``clip_grad_norm_`` over ``grad.to_local()``: every rank scales its shards by a different
coefficient.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.tensor import DTensor
from typing_extensions import override

from lightning_optimizer.reference.preparation import Clipping, PreparationStep
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, RANK_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "FSDP-003",
    [
        "test_sharded_windows_match_one_process[1-module-sgd-clipped]",
        "test_sharded_windows_match_one_process[2-modules-clipped]",
        RANK_PROPERTY,
    ],
    cells=FSDP,
)


@dataclasses.dataclass(frozen=True)
class LocalNormClipping(Clipping):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        if self.algorithm != "norm":
            super().__call__(context, window)
            return
        grads = [p.grad.to_local() if isinstance(p.grad, DTensor) else p.grad for p in window.params()]
        local = [grad for grad in grads if grad is not None]
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(grad) for grad in local]))
        coefficient = torch.clamp(self.value / (norm + 1e-6), max=1.0)
        with torch.no_grad():
            for grad in local:
                grad.mul_(coefficient)


def _local(steps: Sequence[PreparationStep]) -> tuple[PreparationStep, ...]:
    return tuple(
        LocalNormClipping(step.value, step.algorithm) if isinstance(step, Clipping) else step for step in steps
    )


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation, steps=_local(preparation.steps), evaluation=_local(preparation.evaluation)
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
