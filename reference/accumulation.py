"""The accumulation rule: when a micro-step closes a window, and what gradient the window applies."""

from __future__ import annotations

from collections.abc import Iterable
from typing import NamedTuple

import torch

__all__ = ["LoopPosition", "check_accumulate_grad_batches", "closes_window", "normalise_window"]


class LoopPosition(NamedTuple):
    """Where the loop is: the batch index within the epoch and whether it is the epoch's last batch."""

    batch_idx: int
    is_last: bool


def check_accumulate_grad_batches(value: object) -> int:
    """Return ``value`` if it is a positive ``int``; raise a ``TypeError`` or ``ValueError`` that says why not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"accumulate_grad_batches must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"accumulate_grad_batches must be a positive int (1 means no accumulation), got {value}")
    return value


def closes_window(
    make_optimizer_step: bool | None,
    *,
    pending: int,
    accumulate_grad_batches: int,
    position: LoopPosition | None,
) -> bool:
    """Whether this micro-step takes the real step.

    An explicit ``make_optimizer_step`` decides. ``None`` follows the schedule: inside a loop batch, the batch
    completes a window of ``accumulate_grad_batches`` or is the last of its epoch (the partial window is
    flushed); outside a batch, the window (``pending`` earlier micro-steps plus this one) is full.
    """
    if make_optimizer_step is not None:
        return make_optimizer_step
    if position is not None:
        return (position.batch_idx + 1) % accumulate_grad_batches == 0 or position.is_last
    return pending + 1 >= accumulate_grad_batches


def normalise_window(params: Iterable[torch.Tensor], window_length: int, *, divided_by: int = 1) -> None:
    """Turn the gradients of a window of ``window_length`` micro-steps into their mean, in place.

    The gradients are the micro-steps' sum, each divided by ``divided_by`` already (16-mixed divides each loss by
    ``accumulate_grad_batches``, as the recipe does): a full window of that length is its mean as it stands, a
    shorter or longer one is multiplied by ``divided_by / window_length``.
    """
    if window_length == divided_by:
        return  # the common case, every full window (every step without accumulation): nothing to do
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                if divided_by == 1:
                    param.grad.div_(window_length)
                else:
                    param.grad.mul_(divided_by / window_length)
