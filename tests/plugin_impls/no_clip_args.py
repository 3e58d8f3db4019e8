"""The reference behind a factory that cannot take the suite's clipping and loss-scaler arguments.

mypy --strict rejects this module (hence its ignore), but the suite's static check runs mypy on a snippet that
imports it silently: only a check of the factory's run-time signature sees that ``gradient_clip_val`` is refused.
"""

from __future__ import annotations

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import CONTRACT_VERSION, ImplementationInfo


def conformance_info() -> ImplementationInfo[TrainingContext]:
    return ImplementationInfo(
        name="no clipping arguments",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=lambda cell, accumulate_grad_batches=1: TrainingContext(  # type: ignore[arg-type]
            cell.precision, cell.device, accumulate_grad_batches
        ),
    )
