"""A second implementation of the contract, written from the spec alone, sharing no code with the reference.

Importable as ``independent`` with ``PYTHONPATH=<repo>/tests``; ``pytest conformance --impl=independent`` runs
the suite against it. It exists to show that the suite checks the contract, not the reference's internals.
"""

from __future__ import annotations

from typing import Literal

from independent.context import Context
from independent.wrapper import Wrapper
from lightning_optimizer.spec import (
    CONTRACT_VERSION,
    Cell,
    FailurePolicy,
    Feature,
    GradScalerSettings,
    ImplementationInfo,
    Precision,
)

__all__ = ["Context", "Wrapper", "conformance_info", "make_context"]

IMPLEMENTED_PRECISIONS: tuple[Precision, ...] = ("64-true", "32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true")
"""The precisions implemented here, named one by one (contract 2026.12.9 added 16-true): a precision that a later
contract adds is claimed once it is implemented, not by following the spec's list."""
IMPLEMENTED_FEATURES: tuple[Feature, ...] = (
    "closure_evaluating_optimizers",
    "checkpointing",
    "pickling",
    "lr_schedulers",
    "hooks",
    "exact_restore",
    "user_zero_grad",  # contract 2026.12.9
)
"""The optional features implemented here, named one by one for the same reason."""


def make_context(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> Context:
    """A context for one cell of the conformance matrix, with the failure policy and zeroing asked for."""
    return Context(
        cell.precision,
        cell.device,
        accumulate_grad_batches=accumulate_grad_batches,
        gradient_clip_val=gradient_clip_val,
        gradient_clip_algorithm=gradient_clip_algorithm,
        scaler_settings=grad_scaler,
        on_failure=on_failure,
        zero_grad_after_step=zero_grad_after_step,
    )


def conformance_info() -> ImplementationInfo[Context]:
    """What this implementation claims: CPU and XLA, every precision, one or two DDP ranks, every feature.

    The features include ``"exact_restore"`` (``on_failure="restore"`` keeps a failed call's window exactly) and
    ``"user_zero_grad"`` (``zero_grad_after_step=False`` leaves a taken step's gradients to the user's
    ``zero_grad()``, and the next window carries what it leaves).
    """
    return ImplementationInfo(
        name="independent",
        version="1",
        contract_version=CONTRACT_VERSION,  # written against 2026.12.11; the suite refuses any other version
        factory=make_context,
        devices=frozenset({"cpu", "xla"}),
        precisions=frozenset(IMPLEMENTED_PRECISIONS),
        world_sizes=frozenset({1, 2}),
        strategies=frozenset({"none", "ddp", "spmd"}),  # several XLA devices are SPMD (contract 2026.12.7)
        features=frozenset(IMPLEMENTED_FEATURES),
    )
