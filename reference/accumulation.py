"""The accumulation rule: when a micro-step closes a window, and what gradient the window applies.

[STEP-001] to [STEP-003] and [ACC-003]: :meth:`Accumulation.closes`; [ACC-001] and [AMP-007]: :func:`normalise_window`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.window import Window, WindowStage
from lightning_optimizer.spec.types import StepOutcome

if TYPE_CHECKING:
    from lightning_optimizer.reference.windows import LoopPosition

__all__ = ["Accumulation", "check_accumulate_grad_batches", "normalise_window"]


def check_accumulate_grad_batches(value: object) -> int:
    """Return ``value`` if it is a positive ``int``; raise a ``TypeError`` or ``ValueError`` that says why not."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"accumulate_grad_batches must be a positive int, got {value!r} ({type(value).__name__})")
    if value < 1:
        raise ValueError(f"accumulate_grad_batches must be a positive int (1 means no accumulation), got {value}")
    return value


class Accumulation:
    """The schedule of ``make_optimizer_step=None``: windows of ``accumulate_grad_batches`` micro-steps [CTX-001]."""

    __slots__ = ("accumulate_grad_batches",)

    def __init__(self, accumulate_grad_batches: object) -> None:
        self.accumulate_grad_batches = check_accumulate_grad_batches(accumulate_grad_batches)

    def closes(self, make_optimizer_step: bool | None, length: int, position: LoopPosition | None) -> bool:
        """Whether this micro-step of a window of ``length`` earlier ones takes the real step [STEP-001 to STEP-003].

        An explicit ``make_optimizer_step`` decides. ``None`` follows the schedule: inside a loop batch, the batch
        completes a window of ``accumulate_grad_batches`` or is the last of its epoch (the partial window is
        flushed); outside a batch, the window (``length`` earlier micro-steps plus this one) is full.
        """
        if make_optimizer_step is not None:
            return make_optimizer_step
        if position is not None:
            return (position.batch_idx + 1) % self.accumulate_grad_batches == 0 or position.is_last
        return length + 1 >= self.accumulate_grad_batches

    def accumulated(self, window: Window) -> None:
        """A micro-step that only accumulated: the window one longer [STEP-002, STEP-004]."""
        window.length += 1
        window.last_outcome = StepOutcome.ACCUMULATED
        window.move(WindowStage.READY)

    def closed(self, window: Window, *, skipped: bool) -> None:
        """The real step returned: the window empty, the step counted unless skipped [AMP-004, SCHED-002].

        What the step leaves of its gradients is the zeroing setting's (:mod:`.zeroing`).
        """
        if skipped:
            window.last_outcome = StepOutcome.SKIPPED_NON_FINITE
            # A scheduler built on the inner optimizer would otherwise warn that it stepped first.
            torch_compat.mark_stepped_for_scheduler(window.optimizer)
        else:
            window.steps += 1
            window.last_outcome = StepOutcome.STEPPED
        window.length = 0
        window.move(WindowStage.READY)

    def discarded(self, window: Window) -> None:
        """A failed call discarded the window (its gradients are gone already) [FAIL-003, FAIL-007].

        A failed ``unscale_gradients()`` between calls discards a window that is ready already.
        """
        window.length = 0
        window.last_outcome = StepOutcome.DISCARDED
        if window.stage is not WindowStage.READY:
            window.move(WindowStage.READY)

    def zero_grad_clears(self, window: Window) -> bool:
        """Whether ``zero_grad()`` clears ``window``: not while it holds accumulated micro-steps [ZERO-002]."""
        return window.length == 0


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
