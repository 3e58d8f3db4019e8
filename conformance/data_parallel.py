"""The data-parallel epoch that the DDP, FSDP and XLA checks share: plans of windows, and the plain-PyTorch oracle.

Seven batches with ``accumulate_grad_batches=3``; each plan gives one prepared module's ``make_optimizer_step`` per
batch and the windows that the rule makes of them. The oracle (:func:`oracle`, on :func:`plain_epoch`) is plain
PyTorch on the global batch (every rank's shard, or every device's), so it is the same whether ranks or devices
share the batch.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import param_values
from lightning_optimizer.conformance.harness import LOSS_FACTOR, Batch, oracle_step_done
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    ClipFunction,
    PrepareHook,
    oracle_loss,
    plain_scaler,
    real_step,
    scaled_backward,
    update_scaler,
)
from lightning_optimizer.conformance.scenarios import (
    ACCUMULATE,
    EPOCH,
    build_model,
    build_optimizer,
    build_sharded_optimizer,
    global_batches,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome

__all__ = [
    "EVERY_SECOND_BATCH",
    "SCHEDULE_CUT_SHORT_KEPT_OPEN",
    "Calls",
    "Params",
    "Plan",
    "load",
    "oracle",
    "plain_epoch",
]

Params = list[list[list[torch.Tensor]]]
"""Every module's parameters after every batch: ``params[batch][module]``."""
Calls = Sequence[Sequence[tuple[int, int | None]]]
"""Per batch, each call in order: ``(j, length)``, a micro-step of model ``j`` that closes a window of ``length``
micro-steps, or accumulates (``None``)."""


@dataclass(frozen=True)
class Plan:
    """One prepared module's part of the epoch: its ``make_optimizer_step`` per batch and the windows they make.

    ``windows`` worked out by hand must be those of the rule (``accumulate_grad_batches=3``, the last batch
    flushes); left out, the rule works them out. ``optimizer``: ``""`` for the module's SGD
    (:func:`.scenarios.build_optimizer`), else a kind of :func:`.scenarios.build_sharded_optimizer`. ``raise_at``:
    the batches where a call whose closure raises after its backward comes first, whose window the failure policy
    ``on_failure`` discards (its retry starts a new one) or restores. ``user_sharded_blocks``: the scenario shards
    the module's ``Linear`` layers itself before ``prepare_module``.
    """

    module: str
    make_optimizer_step: tuple[bool | None, ...]
    windows: tuple[tuple[int, ...], ...] = ()
    optimizer: str = ""
    raise_at: tuple[int, ...] = ()
    on_failure: str = "discard"
    user_sharded_blocks: bool = False

    def __post_init__(self) -> None:
        windows, _ = self.rule()
        assert self.windows in ((), windows), f"{self}: the rule makes the windows {windows}"
        object.__setattr__(self, "windows", windows)

    def rule(self) -> tuple[tuple[tuple[int, ...], ...], dict[int, int]]:
        """The windows by the rule, and the micro-steps the open window held at each failing call.

        ``True`` closes, ``False`` keeps open, ``None`` closes every third batch and at the last one.
        """
        windows: list[tuple[int, ...]] = []
        current: list[int] = []
        held = {}
        for batch_idx, mos in enumerate(self.make_optimizer_step):
            if batch_idx in self.raise_at:
                held[batch_idx] = len(current)
                current = [] if self.on_failure == "discard" else current
            current.append(batch_idx)
            last = batch_idx == len(self.make_optimizer_step) - 1
            if mos if mos is not None else (batch_idx + 1) % ACCUMULATE == 0 or last:
                windows.append(tuple(current))
                current = []
        return tuple(windows), held

    @property
    def closing(self) -> dict[int, int]:
        """The batch that closes each window, and the window's length."""
        return {window[-1]: len(window) for window in self.windows}

    def calls(self, j: int, batch_idx: int) -> list[tuple[int, int | None]]:
        """Module ``j``'s call of :data:`Calls` in batch ``batch_idx``: none in a window that a failure discarded."""
        return [(j, self.closing.get(batch_idx))] if any(batch_idx in w for w in self.windows) else []


SCHEDULE_CUT_SHORT_KEPT_OPEN = Plan(
    "a",
    (None, None, None, None, True, False, None),
    # {0, 1, 2}: the schedule closes it at batch 2; {3, 4}: True cuts it short; False at batch 5 keeps it open
    # where the schedule would close it, and the last batch (is_last) flushes the partial {5, 6}.
    ((0, 1, 2), (3, 4), (5, 6)),
)
EVERY_SECOND_BATCH = Plan(
    "b",
    (False, True, False, True, False, True, None),
    # True/False every second batch ({0, 1}, {2, 3}, {4, 5}: False at batch 2 keeps the window open where the
    # schedule would close); the last batch, left to the schedule, flushes a window of one micro-step {6}.
    ((0, 1), (2, 3), (4, 5), (6,)),
)
assert all(len(plan.make_optimizer_step) == EPOCH for plan in (SCHEDULE_CUT_SHORT_KEPT_OPEN, EVERY_SECOND_BATCH))


def plain_epoch(
    cell: Cell,
    optimizers: Sequence[tuple[torch.nn.Module, torch.optim.Optimizer]],
    batches: Sequence[Batch],
    calls: Calls,
    scaler: GradScaler | None,
    *,
    accumulate: int = 1,
    factor: float = LOSS_FACTOR,
    reduce: PrepareHook | None = None,
    clip: ClipFunction | None = None,
    blow_up: Container[tuple[int, int]] = (),
    before_forward: Callable[[int, int], object] | None = None,
) -> tuple[Params, list[list[StepOutcome]]]:
    """Plain PyTorch, one bare optimizer per model: each model's parameters after every batch, and its outcome.

    Each call of :data:`Calls` is a micro-step (its loss infinite where ``(batch, j)`` is in ``blow_up``;
    ``before_forward(batch, j)`` runs first); one that closes a window takes :func:`.plain_loop.real_step`
    (``reduce``, ``clip``) and a graph cut. The scaler is updated once per batch in which a window closed, the open
    windows brought to the new scale [AMP-006]. A model without a call in a batch reports ``ACCUMULATED``.
    """
    params: Params = []
    outcomes: list[list[StepOutcome]] = []
    every_param = [param for model, _ in optimizers for param in model.parameters()]
    for batch_idx, batch in enumerate(batches):
        outcomes.append([StepOutcome.ACCUMULATED] * len(optimizers))
        for j, length in calls[batch_idx]:
            model, optimizer = optimizers[j]
            if before_forward is not None:
                before_forward(batch_idx, j)
            scaled_backward(oracle_loss(model, batch, cell, (batch_idx, j) in blow_up, factor), scaler, accumulate)
            if length is not None:
                finite = real_step(
                    optimizer, length, scaler, accumulate, reduce=reduce, clip=clip, check_finite=scaler is not None
                )
                oracle_step_done(cell)
                outcomes[-1][j] = StepOutcome.STEPPED if finite else StepOutcome.SKIPPED_NON_FINITE
        if any(length is not None for _, length in calls[batch_idx]):
            update_scaler(scaler, every_param)
        params.append([param_values(model.parameters(), to_cpu=True) for model, _ in optimizers])
    return params, outcomes


def oracle(
    cell: Cell,
    plans: Sequence[Plan],
    *,
    calls: Calls | None = None,
    batches: Sequence[Batch] | None = None,
    optimizer: Callable[[Plan, torch.nn.Module], torch.optim.Optimizer] | None = None,
    scaler: GradScalerSettings | None = None,
    **options: Any,
) -> tuple[Params, list[list[StepOutcome]]]:
    """:func:`plain_epoch` of each plan's module (a fresh copy on the cell), with its optimizer or ``optimizer``.

    The calls are the plans' own (each module once a batch, in order) unless given; the batches the global ones of
    the cell's world; under 16-mixed one plain ``GradScaler`` (``scaler`` settings, or the defaults) for all. No
    step may overflow but where ``blow_up`` plants a non-finite loss.
    """
    models = [oracle_copy(build_model(plan.module), cell) for plan in plans]
    optimizers = [
        (model, optimizer(plan, model) if optimizer else _optimizer(plan, model, cell))
        for plan, model in zip(plans, models, strict=True)
    ]
    batches = global_batches(cell.world_size) if batches is None else batches
    if calls is None:
        calls = [[c for j, plan in enumerate(plans) for c in plan.calls(j, b)] for b in range(len(batches))]
    params, outcomes = plain_epoch(cell, optimizers, batches, calls, plain_scaler(cell, scaler), **options)
    assert options.get("blow_up") or not any(StepOutcome.SKIPPED_NON_FINITE in row for row in outcomes), (
        "the check's own oracle overflowed: its inputs need another scale"
    )
    return params, outcomes


def _optimizer(plan: Plan, model: torch.nn.Module, cell: Cell) -> torch.optim.Optimizer:
    if plan.optimizer:
        return build_sharded_optimizer(plan.optimizer, plan.module, model.parameters(), cell)
    return build_optimizer(plan.module, model.parameters())


def load(cell: Cell, module: str, values: list[torch.Tensor]) -> torch.nn.Module:
    """Module ``module`` in the cell's dtype and device, holding ``values`` (a scenario's parameters)."""
    model = oracle_copy(build_model(module), cell)
    with torch.no_grad():
        for param, value in zip(model.parameters(), values, strict=True):
            param.copy_(value)
    return model
