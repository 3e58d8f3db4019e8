"""Gradient clipping of a window, after normalisation and unscaling, before the inner step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch
from torch.distributed.tensor import DTensor

__all__ = ["ClipAlgorithm", "check_clipping", "clip_gradients"]

ClipAlgorithm = Literal["norm", "value"]


def check_clipping(value: object, algorithm: object) -> tuple[float | None, ClipAlgorithm]:
    """Validate ``gradient_clip_val`` (``None`` or a positive number) and the algorithm name."""
    if algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")
    if value is None:
        if algorithm == "value":
            raise ValueError(
                "gradient_clip_algorithm='value' clips each gradient element to [-gradient_clip_val, "
                "gradient_clip_val], but gradient_clip_val is None, so nothing would be clipped: pass "
                "gradient_clip_val, or leave gradient_clip_algorithm at its default 'norm' to clip nothing"
            )
        return None, algorithm
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"gradient_clip_val must be None or a finite positive number, got {value!r}")
    return float(value), algorithm


def clip_gradients(params: Iterable[torch.Tensor], value: float, algorithm: ClipAlgorithm) -> None:
    """Clip the gradients in place: their total 2-norm to ``value``, or each element to ``[-value, value]``."""
    grads = [param for param in params if param.grad is not None]
    if algorithm == "value":
        torch.nn.utils.clip_grad_value_(grads, value)
    elif any(isinstance(param.grad, DTensor) for param in grads):
        _clip_sharded_norm(grads, value)
    else:
        torch.nn.utils.clip_grad_norm_(grads, value)


def _clip_sharded_norm(params: list[torch.Tensor], value: float) -> None:
    """``clip_grad_norm_`` over sharded (``DTensor``) gradients, by the global norm, with its coefficient exactly.

    ``clip_grad_norm_`` on ``DTensor`` gradients reduces the norm across ranks, but adds its ``1e-6`` to a norm
    still partial per rank; the coefficient is computed here from the gathered norm instead, as on one process.
    """
    grads = [param.grad for param in params if param.grad is not None]
    total = torch.nn.utils.get_total_norm(grads, norm_type=2.0)
    if isinstance(total, DTensor):
        total = total.full_tensor()
    coefficient = torch.clamp(value / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for grad in grads:
            local = grad.to_local() if isinstance(grad, DTensor) else grad
            local.mul_(coefficient.to(device=local.device, dtype=local.dtype))
