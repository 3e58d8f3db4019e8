"""The reference's record for the conformance suite: ``pytest conformance --impl=lightning_optimizer.reference``."""

from __future__ import annotations

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.devices import SUPPORTED_DEVICES
from lightning_optimizer.reference.precision import SUPPORTED_PRECISIONS
from lightning_optimizer.spec import CONTRACT_VERSION, FEATURES, Cell, DeviceKind, ImplementationInfo

__all__ = ["conformance_info"]

VERSION = "0.1.0"


def _context_for(cell: Cell, *, accumulate_grad_batches: int = 1) -> TrainingContext:
    return TrainingContext(cell.precision, cell.device, accumulate_grad_batches=accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[TrainingContext]:
    """What the reference implements, and how the suite builds its training contexts."""
    devices: frozenset[DeviceKind] = frozenset(d for d in ("cpu", "cuda", "xla") if d in SUPPORTED_DEVICES)
    return ImplementationInfo(
        name="lightning-optimizer reference",
        version=VERSION,
        contract_version=CONTRACT_VERSION,
        factory=_context_for,
        devices=devices,
        precisions=SUPPORTED_PRECISIONS,
        world_sizes=frozenset({1}),
        features=frozenset(FEATURES),
    )
