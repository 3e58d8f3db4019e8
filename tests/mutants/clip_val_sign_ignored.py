"""CTX-002 broken: a negative ``gradient_clip_val`` is taken by its magnitude instead of being refused.

A framework that "normalises" the setting with ``abs()`` before its positivity check: ``-0.5`` clips at ``0.5``
and ``-inf`` becomes ``inf`` (never clips), where the contract asks for a ``ValueError``.
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
        if gradient_clip_val is not None:
            gradient_clip_val = abs(gradient_clip_val)
            if not gradient_clip_val > 0:
                raise ValueError(f"gradient_clip_val must not be 0, got {gradient_clip_val!r}")
        super().__init__(
            precision, device, accumulate_grad_batches, gradient_clip_algorithm=gradient_clip_algorithm, scaler=scaler
        )
        self._clip_val = None if gradient_clip_val is None else float(gradient_clip_val)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
