"""The checkpoint scenario that the checks and the resume worker share.

One epoch of 7 batches with ``accumulate_grad_batches=3`` and ``make_optimizer_step=True`` at batch 4: windows
{0, 1, 2}, {3, 4} (cut short) and {5, 6} (flushed by the last batch), SGD with momentum.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import torch

from lightning_optimizer.conformance.harness import cell_device, cell_dtype, make_batches, make_model, mse
from lightning_optimizer.spec import Cell, TrainingContext

__all__ = ["EPOCH", "SCHEDULE", "build", "checkpoints", "params", "resume", "step_once", "uninterrupted"]

EPOCH = 7
SCHEDULE: dict[int, bool | None] = {4: True}

MakeContext = Callable[..., TrainingContext]


def build(make_context: MakeContext) -> tuple[TrainingContext, torch.nn.Module, Any]:
    """A fresh context, its prepared model and its wrapped SGD."""
    context = make_context(accumulate_grad_batches=3)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    return context, model, wrapper


def params(model: torch.nn.Module) -> list[torch.Tensor]:
    """Detached CPU copies of the model's parameters."""
    return [p.detach().cpu().clone() for p in model.parameters()]


def step_once(context: TrainingContext, model: torch.nn.Module, wrapper: Any, batch_idx: int, cell: Cell) -> None:
    """Batch ``batch_idx`` of the epoch: one closure-form step with the scenario's schedule."""
    batch = make_batches(EPOCH)[batch_idx]

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        wrapper.backward(loss)
        return loss

    with context.batch(batch_idx, is_last=batch_idx == EPOCH - 1):
        wrapper.step(closure, make_optimizer_step=SCHEDULE.get(batch_idx))


def uninterrupted(make_context: MakeContext, cell: Cell) -> list[torch.Tensor]:
    """The parameters after the whole epoch, without interruption."""
    context, model, wrapper = build(make_context)
    for batch_idx in range(EPOCH):
        step_once(context, model, wrapper, batch_idx, cell)
    return params(model)


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


def resume(make_context: MakeContext, cell: Cell, checkpoint: bytes, start: int) -> list[torch.Tensor]:
    """Load ``checkpoint`` into freshly built objects and train the rest of the epoch from batch ``start``."""
    context, model, wrapper = build(make_context)
    saved = torch.load(io.BytesIO(checkpoint), weights_only=True)
    model.load_state_dict(saved["model"])
    wrapper.load_state_dict(saved["optimizer"])
    context.load_state_dict(saved["context"])
    for batch_idx in range(start, EPOCH):
        step_once(context, model, wrapper, batch_idx, cell)
    return params(model)
