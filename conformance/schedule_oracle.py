"""Whole training schedules, and a plain-PyTorch oracle that predicts what the contract makes of them.

A :class:`Schedule` is what a user's loop does: one to three optimizers over one model (one head each), an
``accumulate_grad_batches``, epochs of iterations, and in each iteration some of the optimizers called once, in
some order, with ``make_optimizer_step`` ``True``, ``False`` or ``None``, in the closure form or the
backward-then-step form, sometimes after ``zero_grad()``, sometimes with an injected non-finite loss (16-mixed),
sometimes with a first attempt whose closure raises, and checkpoints taken between iterations.

:class:`ScheduleOracle` trains the same model with bare optimizers, plain ``torch.autocast`` and, under 16-mixed,
one plain ``torch.amp.GradScaler``, following the rules as the spec states them, worked out here without any
wrapper:

- a call with ``make_optimizer_step=None`` closes its window when ``(batch_idx + 1) % accumulate_grad_batches == 0``
  or when the batch is the last of its epoch [STEP-003]; ``True`` closes it now, ``False`` accumulates [STEP-001,
  STEP-002];
- a real step applies the mean of the window's micro-batch gradients, whatever its length [ACC-001, ACC-003];
  under 16-mixed the mean is unscaled once, then ``scaler.step`` [AMP-002]; a step whose unscaled gradients are
  not finite is skipped, changes nothing and is not counted [AMP-004]; gradients are cleared after every real
  step [ZERO-001]; ``zero_grad()`` with a window open does nothing [ZERO-002];
- while an optimizer's loss is backpropagated, the other heads do not require grad [TOGGLE-001];
- the scaler is updated once per iteration, after every optimizer that stepped in it [AMP-003], and a window
  left open across a change of the scale is rescaled to the new scale [AMP-006];
- a call whose closure raises changes nothing [CLOS-003]; a checkpoint resumed between iterations changes
  nothing [CKPT-002]: the oracle ignores both.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal, get_args

import torch

from lightning_optimizer.conformance.harness import (
    Batch,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
)
from lightning_optimizer.spec import Cell, StepOutcome

__all__ = [
    "CALL_FORMS",
    "COUPLING",
    "LOSS_FACTOR",
    "OPTIMIZER_KINDS",
    "Call",
    "CallForm",
    "IterationPosition",
    "OptimizerKind",
    "Schedule",
    "ScheduleModel",
    "ScheduleOracle",
    "make_optimizer",
    "schedule_batches",
    "schedule_loss",
]

OptimizerKind = Literal["sgd", "adam"]
"""``sgd``: SGD with momentum; ``adam``: Adam (its state counts the real steps)."""
OPTIMIZER_KINDS: Final[tuple[OptimizerKind, ...]] = get_args(OptimizerKind)

CallForm = Literal["closure", "closure_plain_backward", "toggle_model"]
"""How the user code of a call backpropagates: ``step(closure)`` whose closure calls ``wrapper.backward``; the
same with ``loss.backward()`` (never under 16-mixed, where the wrapper must scale); or the backward-then-step
form, ``wrapper.backward`` inside ``with wrapper.toggle_model():`` and then ``step()`` without a closure."""
CALL_FORMS: Final[tuple[CallForm, ...]] = get_args(CallForm)

LOSS_FACTOR = 1e-3
"""Keeps scaled fp16 gradients finite at GradScaler's initial scale, so that only injected overflows skip."""
COUPLING = 0.5
"""Weight of the other heads' outputs in a head's prediction: a missing toggle leaks gradients into them."""


@dataclass(frozen=True)
class Call:
    """One ``step()`` call of one optimizer in an iteration, and what the user code around it does."""

    optimizer: int
    make_optimizer_step: bool | None = None
    form: CallForm = "closure"
    zero_grad_first: bool = False
    """``wrapper.zero_grad()`` right before the call (the classic ``zero_grad(); backward(); step()`` loop)."""
    non_finite: bool = False
    """The loss is multiplied by infinity (16-mixed only: the window's gradients overflow, its step is skipped)."""
    raises_first: bool = False
    """A first attempt raises inside the closure (or the ``toggle_model`` block) after the forward pass, before
    the backward; the user then repeats the call, which succeeds."""


@dataclass(frozen=True)
class IterationPosition:
    """One iteration of a schedule: where it is in the loop and the calls it makes."""

    index: int
    """The iteration's position in the whole schedule (0, 1, ... across epochs)."""
    epoch: int
    batch_idx: int
    is_last: bool
    calls: tuple[Call, ...]


@dataclass(frozen=True)
class Schedule:
    """A generated training loop: optimizers, accumulation, epochs of iterations, checkpoints."""

    optimizers: tuple[OptimizerKind, ...]
    accumulate_grad_batches: int
    epochs: tuple[tuple[tuple[Call, ...], ...], ...]
    """For each epoch, for each of its iterations, the calls in call order (at most one per optimizer)."""
    resume_after: frozenset[int] = field(default_factory=frozenset)
    """Iterations (by schedule index) after which the loop checkpoints and resumes in fresh objects."""

    def iterations(self) -> Iterator[IterationPosition]:
        """Every iteration, in order."""
        index = 0
        for epoch, iterations in enumerate(self.epochs):
            for batch_idx, calls in enumerate(iterations):
                yield IterationPosition(index, epoch, batch_idx, batch_idx == len(iterations) - 1, calls)
                index += 1

    @property
    def length(self) -> int:
        """How many iterations the schedule has."""
        return sum(len(iterations) for iterations in self.epochs)


class ScheduleModel(torch.nn.Module):
    """One small MLP head per optimizer, seeded; every head's output feeds every head's loss."""

    def __init__(self, heads: int) -> None:
        super().__init__()
        self.heads = torch.nn.ModuleList(make_model(seed=40 + i, sizes=(4, 6, 2)) for i in range(heads))

    def head_parameters(self, head: int) -> list[torch.nn.Parameter]:
        """The parameters of head ``head``: what its optimizer owns."""
        return list(self.heads[head].parameters())


def make_optimizer(kind: OptimizerKind, params: Sequence[torch.nn.Parameter]) -> torch.optim.Optimizer:
    """The bare optimizer of a kind, with the hyper-parameters that every schedule uses."""
    if kind == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adam(params, lr=0.05)


def schedule_batches(schedule: Schedule) -> list[Batch]:
    """One seeded ``(x, y)`` batch per iteration of the schedule, shared by all of its calls."""
    return make_batches(schedule.length, seed=17)


def schedule_loss(
    model: ScheduleModel, head: int, batch: Batch, cell: Cell, *, non_finite: bool = False
) -> torch.Tensor:
    """Head ``head``'s loss on ``batch``: its own output plus ``COUPLING`` times every other head's.

    Run it under the precision's autocast. Only toggling keeps the other heads' gradients out of this loss's
    backward pass. ``non_finite`` multiplies the loss by infinity.
    """
    device, dtype = cell_device(cell), cell_dtype(cell)
    x, y = (t.to(device=device, dtype=dtype) for t in batch)
    outputs = [net(x) if i == head else COUPLING * net(x) for i, net in enumerate(model.heads)]
    prediction = torch.stack(outputs).sum(dim=0).to(dtype)
    loss = torch.nn.functional.mse_loss(prediction, y) * LOSS_FACTOR
    return loss * math.inf if non_finite else loss


class ScheduleOracle:
    """The plain-PyTorch run of a schedule: bare optimizers, plain autocast, one plain ``GradScaler``.

    :meth:`iteration` runs one iteration and returns each call's outcome; afterwards ``model``, ``optimizers``,
    ``scaler``, ``steps`` and ``scales`` hold what an implementation must match.
    """

    def __init__(self, schedule: Schedule, cell: Cell) -> None:
        self.schedule, self.cell = schedule, cell
        self.model = ScheduleModel(len(schedule.optimizers)).to(device=cell_device(cell), dtype=cell_dtype(cell))
        self.optimizers = [
            make_optimizer(kind, self.model.head_parameters(i)) for i, kind in enumerate(schedule.optimizers)
        ]
        self.scaler = oracle_scaler(cell)
        self.batches = schedule_batches(schedule)
        self.pending = [0] * len(self.optimizers)
        """Micro-steps in each optimizer's open window."""
        self.steps = [0] * len(self.optimizers)
        """Real steps taken by each optimizer (skipped ones do not count)."""
        self.scales: list[float] = []
        """The loss scale of every backward pass so far (1.0 without a scaler)."""

    def iteration(self, position: IterationPosition) -> list[StepOutcome]:
        """Run one iteration; return each call's outcome, in call order."""
        outcomes = [self._call(position, call) for call in position.calls]
        if self.scaler is not None and any(outcome is not StepOutcome.ACCUMULATED for outcome in outcomes):
            old = self.scaler.get_scale()
            self.scaler.update()
            new = self.scaler.get_scale()
            if new != old:
                with torch.no_grad():
                    for index, pending in enumerate(self.pending):
                        for param in self.model.head_parameters(index) if pending else ():
                            if param.grad is not None:
                                param.grad.mul_(new / old)
        return outcomes

    def _closes(self, position: IterationPosition, call: Call) -> bool:
        if call.make_optimizer_step is not None:
            return call.make_optimizer_step
        n = self.schedule.accumulate_grad_batches
        return (position.batch_idx + 1) % n == 0 or position.is_last

    def _call(self, position: IterationPosition, call: Call) -> StepOutcome:
        index = call.optimizer
        optimizer = self.optimizers[index]
        if call.zero_grad_first and self.pending[index] == 0:
            optimizer.zero_grad(set_to_none=True)
        self._backward(position, call)
        if not self._closes(position, call):
            self.pending[index] += 1
            return StepOutcome.ACCUMULATED
        params = self.model.head_parameters(index)
        window = self.pending[index] + 1
        with torch.no_grad():
            for param in params:
                if param.grad is not None:
                    param.grad /= window
        finite = True
        if self.scaler is None:
            optimizer.step()
        else:
            self.scaler.unscale_(optimizer)
            finite = all(bool(torch.isfinite(p.grad).all()) for p in params if p.grad is not None)
            self.scaler.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        oracle_step_done(self.cell)
        self.pending[index] = 0
        self.steps[index] += finite
        return StepOutcome.STEPPED if finite else StepOutcome.SKIPPED_NON_FINITE

    def _backward(self, position: IterationPosition, call: Call) -> None:
        """The call's forward and backward pass, with only its own head requiring grad."""
        others = [
            param for i in range(len(self.optimizers)) if i != call.optimizer for param in self.model.head_parameters(i)
        ]
        for param in others:
            param.requires_grad_(False)
        try:
            with oracle_autocast(self.cell):
                loss = schedule_loss(
                    self.model, call.optimizer, self.batches[position.index], self.cell, non_finite=call.non_finite
                )
            if self.scaler is None:
                self.scales.append(1.0)
                loss.backward()
            else:
                self.scales.append(self.scaler.get_scale())
                self.scaler.scale(loss).backward()
        finally:
            for param in others:
                param.requires_grad_(True)
