"""CTX-002 broken: ``gradient_clip_val=0`` means "no clipping" instead of being refused.

Lightning's ``Trainer`` reads 0 as clipping off; the contract refuses it, since a clip at norm 0 would zero every
gradient and a silent "off" hides the typo.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def __init__(
        self,
        precision: Any = "32-true",
        device: Any = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Any = "norm",
        scaler: Any = None,
    ) -> None:
        super().__init__(
            precision,
            device,
            accumulate_grad_batches,
            gradient_clip_val=None if gradient_clip_val == 0 else gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            scaler=scaler,
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
