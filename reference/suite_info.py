"""The reference's record for the conformance suite: ``pytest conformance --impl=lightning_optimizer.reference``."""

from __future__ import annotations

from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference.clipping import ClipAlgorithm
from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.devices import SUPPORTED_DEVICES
from lightning_optimizer.reference.precision import SUPPORTED_PRECISIONS
from lightning_optimizer.spec import (
    CONTRACT_VERSION,
    DEVICE_KINDS,
    FEATURES,
    STRATEGIES,
    Cell,
    DeviceKind,
    FailurePolicy,
    GradScalerSettings,
    ImplementationInfo,
    __version__,
)

__all__ = ["conformance_info", "context_for"]


def context_for(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: ClipAlgorithm = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> TrainingContext:
    """The suite's factory: a reference context for ``cell`` with the settings a check asks for."""
    scaler = None
    if grad_scaler is not None and cell.precision == "16-mixed":  # the suite passes settings in 16-mixed only
        scaler = GradScaler(cell.device, **grad_scaler.as_kwargs())
    return TrainingContext(
        cell.precision,
        cell.device,
        accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        scaler=scaler,
        strategy="fsdp" if cell.strategy == "fsdp" else "ddp",
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def conformance_info() -> ImplementationInfo[TrainingContext]:
    """What the reference implements, and how the suite builds its training contexts."""
    devices: frozenset[DeviceKind] = frozenset(d for d in DEVICE_KINDS if d in SUPPORTED_DEVICES)
    return ImplementationInfo(
        name="lightning-optimizer reference",
        version=__version__,
        contract_version=CONTRACT_VERSION,
        factory=context_for,
        devices=devices,
        precisions=SUPPORTED_PRECISIONS,
        world_sizes=frozenset({1, 2}),
        strategies=frozenset(STRATEGIES),
        features=frozenset(FEATURES),
    )
