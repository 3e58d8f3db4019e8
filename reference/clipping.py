"""Gradient clipping of a window, after normalisation and unscaling, before the inner step."""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Literal

import torch

__all__ = ["ClipAlgorithm", "check_clipping", "clip_gradients"]

ClipAlgorithm = Literal["norm", "value"]


def check_clipping(value: object, algorithm: object) -> tuple[float | None, ClipAlgorithm]:
    """Validate ``gradient_clip_val`` (``None`` or a positive number) and the algorithm name."""
    if algorithm not in ("norm", "value"):
        raise ValueError(f"gradient_clip_algorithm must be 'norm' or 'value', got {algorithm!r}")
    if value is None:
        return None, algorithm
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"gradient_clip_val must be None or a finite positive number, got {value!r}")
    return float(value), algorithm


def clip_gradients(params: Iterable[torch.Tensor], value: float, algorithm: ClipAlgorithm) -> None:
    """Clip the gradients in place: their total 2-norm to ``value``, or each element to ``[-value, value]``."""
    grads = [param for param in params if param.grad is not None]
    if algorithm == "norm":
        torch.nn.utils.clip_grad_norm_(grads, value)
    else:
        torch.nn.utils.clip_grad_value_(grads, value)
