"""CTX-002 broken: ``gradient_clip_val`` is refused only when ``value <= 0``, so ``nan`` constructs.

``nan <= 0`` is false: the context is built, and its first clipped step turns every parameter into NaN
(``clip_grad_norm_`` scales by ``nan / norm``). The check as it stood before contract 2026.12.1.
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
        if gradient_clip_val is not None and gradient_clip_val <= 0:
            raise ValueError(f"gradient_clip_val must be positive, got {gradient_clip_val!r}")
        super().__init__(
            precision, device, accumulate_grad_batches, gradient_clip_algorithm=gradient_clip_algorithm, scaler=scaler
        )
        self._clip_val = None if gradient_clip_val is None else float(gradient_clip_val)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
