"""The checkpoint scenario that the checks and the resume worker share.

One epoch of 7 batches with ``accumulate_grad_batches=3`` and ``make_optimizer_step=True`` at batch 4: windows
{0, 1, 2}, {3, 4} (cut short) and {5, 6} (flushed by the last batch), SGD with momentum. Under 16-mixed the loss
of batch 1 is infinite: the first window's step is skipped and the loss scale backs off at the end of batch 2,
so a checkpoint taken after that holds a loss scaler whose state differs from a fresh one's.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from lightning_optimizer.conformance.harness import cell_device, cell_dtype, make_batches, make_model, mse
from lightning_optimizer.spec import Cell, TrainingContext

__all__ = [
    "EPOCH",
    "OVERFLOW_BATCH",
    "SCHEDULE",
    "Trajectory",
    "build",
    "checkpoints",
    "params",
    "resume",
    "step_once",
    "uninterrupted",
]

EPOCH = 7
SCHEDULE: dict[int, bool | None] = {4: True}
OVERFLOW_BATCH = 1
"""Under 16-mixed, the batch whose loss is infinite."""

MakeContext = Callable[..., TrainingContext]


@dataclass
class Trajectory:
    """What a run leaves: the final parameters, and under 16-mixed the loss scale of each batch's backward pass."""

    params: list[torch.Tensor]
    scales: list[float]


def build(make_context: MakeContext) -> tuple[TrainingContext, torch.nn.Module, Any]:
    """A fresh context, its prepared model and its wrapped SGD."""
    context = make_context(accumulate_grad_batches=3)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    return context, model, wrapper


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    """Detached CPU copies of the model's parameters."""
    return [p.detach().cpu().clone() for p in model.parameters()]


def step_once(
    context: TrainingContext,
    model: torch.nn.Module,
    wrapper: Any,
    batch_idx: int,
    cell: Cell,
    scales: list[torch.Tensor] | None = None,
) -> None:
    """Batch ``batch_idx`` of the epoch: one closure-form step with the scenario's schedule.

    Under 16-mixed, ``scales`` receives the factor that the loss was multiplied by before its backward pass (the
    gradient that reaches the loss): the loss scale. (Other precisions scale nothing, which other checks verify;
    observing it would cost XLA cells extra graphs.)
    """
    batch = make_batches(EPOCH)[batch_idx]

    def record(grad: torch.Tensor) -> None:
        if scales is not None:
            scales.append(grad.detach().clone())

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        if cell.precision == "16-mixed":
            if batch_idx == OVERFLOW_BATCH:
                loss = loss * math.inf
            loss.register_hook(record)
        wrapper.backward(loss)
        return loss

    with context.batch(batch_idx, is_last=batch_idx == EPOCH - 1):
        wrapper.step(closure, make_optimizer_step=SCHEDULE.get(batch_idx))


def _run(context: TrainingContext, model: torch.nn.Module, wrapper: Any, start: int, cell: Cell) -> Trajectory:
    scales: list[torch.Tensor] = []
    for batch_idx in range(start, EPOCH):
        step_once(context, model, wrapper, batch_idx, cell, scales)
    return Trajectory(params(model), [float(scale) for scale in scales])


def uninterrupted(make_context: MakeContext, cell: Cell) -> Trajectory:
    """The whole epoch without interruption."""
    return _run(*build(make_context), 0, cell)


def checkpoints(make_context: MakeContext, cell: Cell) -> list[bytes]:
    """A checkpoint after every micro-step (index ``i``: batches ``0..i`` done)."""
    context, model, wrapper = build(make_context)
    saved = []
    for batch_idx in range(EPOCH):
        step_once(context, model, wrapper, batch_idx, cell)
        buffer = io.BytesIO()
        state = {"model": model.state_dict(), "optimizer": wrapper.state_dict(), "context": context.state_dict()}
        torch.save(state, buffer)
        saved.append(buffer.getvalue())
    return saved


def resume(make_context: MakeContext, cell: Cell, checkpoint: bytes, start: int) -> Trajectory:
    """Load ``checkpoint`` into freshly built objects and train the rest of the epoch from batch ``start``."""
    context, model, wrapper = build(make_context)
    saved = torch.load(io.BytesIO(checkpoint), weights_only=True)
    model.load_state_dict(saved["model"])
    wrapper.load_state_dict(saved["optimizer"])
    context.load_state_dict(saved["context"])
    return _run(context, model, wrapper, start, cell)
