"""An implementation whose wrapper lacks ``backward``.

``conformance_info`` declares nothing; ``declared_info`` declares the wrapper-surface check as a deviation.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import CONTRACT_VERSION, Cell, FailurePolicy, GradScalerSettings, ImplementationInfo

MISSING = "backward"


class NoBackwardWrapper:
    """Delegates every member to the reference wrapper, except ``backward``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        if name == MISSING:
            raise AttributeError(name)
        return getattr(self._inner, name)


class BrokenContext(TrainingContext):
    def wrap(self, optimizer: torch.optim.Optimizer) -> Any:
        return NoBackwardWrapper(super().wrap(optimizer))


def _factory(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> BrokenContext:
    scaler = GradScaler(cell.device, **grad_scaler.as_kwargs()) if grad_scaler is not None else None
    return BrokenContext(
        cell.precision,
        cell.device,
        accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        scaler=scaler,
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def conformance_info() -> ImplementationInfo[BrokenContext]:
    return ImplementationInfo(name="no backward", version="0", contract_version=CONTRACT_VERSION, factory=_factory)


def declared_info() -> ImplementationInfo[BrokenContext]:
    return ImplementationInfo(
        name="no backward, declared",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=_factory,
        expected_failures={"test_wrapper_surface": "the wrapper has no backward; call loss.backward() instead"},
    )
