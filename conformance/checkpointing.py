"""The checkpoint scenario that the checks and the resume worker share.

One epoch of 7 batches with ``accumulate_grad_batches=3`` and ``make_optimizer_step=True`` at batch 4: windows
{0, 1, 2}, {3, 4} (cut short) and {5, 6} (flushed by the last batch), SGD with momentum. Under 16-mixed the loss
of batch 1 is infinite: the first window's step is skipped and the loss scale backs off at the end of batch 2,
so a checkpoint taken after that holds a loss scaler whose state differs from a fresh one's.

A second scenario (``*_pair``) has two wrappers, two parameter groups and a group added after wrap, and under
16-mixed a scale that grows every second stepping iteration (so the growth tracker matters on resume).
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from lightning_optimizer.conformance.harness import (
    Batch,
    adam_eps,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

__all__ = [
    "EPOCH",
    "GROWTH",
    "OVERFLOW_BATCH",
    "PAIR_EPOCH",
    "PAIR_SCALES",
    "PAIR_SCHEDULE_B",
    "SCHEDULE",
    "Trajectory",
    "build",
    "build_pair",
    "checkpoints",
    "layer_optimizers",
    "pair_checkpoints",
    "pair_resume",
    "pair_uninterrupted",
    "params",
    "plan_loss",
    "resume",
    "run_plan",
    "step_once",
    "step_pair",
    "through_a_checkpoint",
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


def through_a_checkpoint(state: object) -> Any:
    """``state`` as a checkpoint carries it: through ``torch.save`` and ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def layer_optimizers(model: torch.nn.Module, cell: Cell, sgd_lr: float = 0.1) -> list[torch.optim.Optimizer]:
    """A (SGD with momentum on the first layer) and B (Adam, the cell's ``eps``, on the rest), in wrapping order."""
    first, rest = list(model.parameters())[:2], list(model.parameters())[2:]
    return [torch.optim.SGD(first, lr=sgd_lr, momentum=0.9), torch.optim.Adam(rest, lr=0.01, eps=adam_eps(cell))]


def plan_loss(
    forward: Callable[[torch.Tensor], torch.Tensor],
    batch: Batch,
    cell: Cell,
    factor: float = 1.0,
    *,
    infinite: bool = False,
    scales: list[float] | None = None,
) -> torch.Tensor:
    """``factor`` times ``forward``'s MSE on ``batch``; under 16-mixed infinite if asked, its scale kept in ``scales``.

    The gradient that reaches the loss in its backward pass is the factor the loss was multiplied by: its scale.
    """
    x, y = (t.to(device=cell_device(cell), dtype=cell_dtype(cell)) for t in batch)
    loss = torch.nn.functional.mse_loss(forward(x).to(y.dtype), y) * factor
    if cell.precision == "16-mixed" and infinite:
        loss = loss * math.inf
    if cell.precision == "16-mixed" and scales is not None:
        loss.register_hook(lambda grad: scales.append(float(grad)))
    return loss


def run_plan(
    context: TrainingContext,
    model: torch.nn.Module,
    wrappers: Sequence[Any],
    plan: Mapping[int, Sequence[bool | None] | Mapping[int, bool | None]],
    cell: Cell,
    *,
    batches: Sequence[Batch],
    overflow: tuple[int, int] | None = None,
    scales: list[float] | None = None,
    factor: float = 1.0,
    blocks: bool = True,
) -> list[list[StepOutcome | None]]:
    """Per batch of ``plan``, in its ``batch()`` block unless ``blocks`` is off, wrappers' ``step(closure)`` calls.

    Batch ``i`` is ``batches[i]``; ``plan[i]``: each wrapper's ``make_optimizer_step`` in order, or
    ``{index: make_optimizer_step}`` for some of them. The closure's loss is :func:`plan_loss` under
    ``context.autocast()``, infinite for the ``overflow`` ``(batch, index)``. Returns every wrapper's
    ``last_outcome`` after each batch.
    """
    outcomes: list[list[StepOutcome | None]] = []
    for batch_idx, steps in plan.items():
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1) if blocks else nullcontext():
            for index, make_step in steps.items() if isinstance(steps, Mapping) else enumerate(steps):

                def closure(wrapper: Any = wrappers[index], at: tuple[int, int] = (batch_idx, index)) -> torch.Tensor:
                    with context.autocast():
                        loss = plan_loss(model, batches[at[0]], cell, factor, infinite=at == overflow, scales=scales)
                    wrapper.backward(loss)
                    return loss

                wrappers[index].step(closure, make_optimizer_step=make_step)
        outcomes.append([wrapper.last_outcome for wrapper in wrappers])
    return outcomes


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


# -- the scenario of two wrappers, two parameter groups, a group added after wrap, and a growing loss scale -------

GROWTH = GradScalerSettings(init_scale=2.0**8, growth_interval=2)
"""Under 16-mixed: the scale doubles after every second iteration in which an optimizer stepped."""

PAIR_EPOCH = 7
PAIR_SCHEDULE_B: dict[int, bool | None] = {0: True, 1: False, 2: False, 3: True, 4: False, 5: True, 6: None}
"""B's ``make_optimizer_step`` per batch: windows {0}, {1, 2, 3} (cut short), {4, 5}, {6} (flushed by the last batch).

A follows the schedule of ``accumulate_grad_batches=2``: windows {0, 1}, {2, 3}, {4, 5}, {6} (flushed). Iterations
0, 1, 3, 5 and 6 step an optimizer; under :data:`GROWTH` the scale doubles after iterations 1 and 5, and a checkpoint
after batch 0, 3 or 4 holds a growth tracker of 1, which decides whether the scale grows after iteration 1 or 5.
"""

PAIR_SCALES = [2.0**7] * 4 + [2.0**8] * 8 + [2.0**9] * 2
"""Under 16-mixed, the factor of every backward pass (A's, then B's, per batch), worked by hand: the loss scale
(``2**8``, growing to ``2**9`` and ``2**10``) over ``accumulate_grad_batches=2`` [AMP-007]."""


def build_pair(make_context: MakeContext, cell: Cell) -> tuple[TrainingContext, torch.nn.Module, list[Any]]:
    """A fresh context with two wrappers: A (SGD, two groups), B (Adam, its second group added after wrap)."""
    scaler = {"grad_scaler": GROWTH} if cell.precision == "16-mixed" else {}
    context = make_context(accumulate_grad_batches=2, **scaler)
    model = context.prepare_module(make_model())
    first_weight, first_bias, last_weight, last_bias = model.parameters()
    groups: list[dict[str, Any]] = [{"params": [first_weight]}, {"params": [first_bias], "lr": 0.05, "momentum": 0.5}]
    opt_a = context.wrap(torch.optim.SGD(groups, lr=0.1, momentum=0.9))
    opt_b = context.wrap(torch.optim.Adam([last_weight], lr=0.01, eps=adam_eps(cell)))
    opt_b.add_param_group({"params": [last_bias], "lr": 0.003, "betas": (0.8, 0.9)})
    return context, model, [opt_a, opt_b]


def step_pair(
    context: TrainingContext,
    model: torch.nn.Module,
    wrappers: list[Any],
    batch_idx: int,
    cell: Cell,
    scales: list[torch.Tensor] | None = None,
) -> None:
    """Batch ``batch_idx`` of the pair scenario: A's step, then B's; under 16-mixed ``scales`` gets each loss scale."""
    batch = make_batches(PAIR_EPOCH, seed=4)[batch_idx]
    with context.batch(batch_idx, is_last=batch_idx == PAIR_EPOCH - 1):
        for wrapper, make_optimizer_step in zip(wrappers, (None, PAIR_SCHEDULE_B[batch_idx]), strict=True):

            def closure(wrapper: Any = wrapper) -> torch.Tensor:
                with context.autocast():
                    loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
                if scales is not None and cell.precision == "16-mixed":
                    loss.register_hook(lambda grad: scales.append(grad.detach().clone()))
                wrapper.backward(loss)
                return loss

            wrapper.step(closure, make_optimizer_step=make_optimizer_step)


def _pair_run(
    context: TrainingContext, model: torch.nn.Module, wrappers: list[Any], start: int, cell: Cell
) -> Trajectory:
    scales: list[torch.Tensor] = []
    for batch_idx in range(start, PAIR_EPOCH):
        step_pair(context, model, wrappers, batch_idx, cell, scales)
    return Trajectory(params(model), [float(scale) for scale in scales])


def pair_uninterrupted(make_context: MakeContext, cell: Cell) -> Trajectory:
    """The pair scenario's whole epoch without interruption."""
    return _pair_run(*build_pair(make_context, cell), 0, cell)


def pair_checkpoints(make_context: MakeContext, cell: Cell) -> list[bytes]:
    """A checkpoint of the pair scenario after every batch but the last (index ``i``: batches ``0..i`` done)."""
    context, model, wrappers = build_pair(make_context, cell)
    saved = []
    for batch_idx in range(PAIR_EPOCH - 1):
        step_pair(context, model, wrappers, batch_idx, cell)
        buffer = io.BytesIO()
        state = {
            "model": model.state_dict(),
            "optimizers": [wrapper.state_dict() for wrapper in wrappers],
            "context": context.state_dict(),
        }
        torch.save(state, buffer)
        saved.append(buffer.getvalue())
    return saved


def pair_resume(make_context: MakeContext, cell: Cell, checkpoint: bytes, start: int) -> Trajectory:
    """Fresh objects (the group added again), ``checkpoint`` loaded, the epoch trained on from batch ``start``."""
    context, model, wrappers = build_pair(make_context, cell)
    saved = torch.load(io.BytesIO(checkpoint), weights_only=True)
    model.load_state_dict(saved["model"])
    for wrapper, state in zip(wrappers, saved["optimizers"], strict=True):
        wrapper.load_state_dict(state)
    context.load_state_dict(saved["context"])
    return _pair_run(context, model, wrappers, start, cell)
