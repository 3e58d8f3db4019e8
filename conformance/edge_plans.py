"""Plans of windows near float16's range, explicit or drawn, run through an implementation beside torch's recipe.

A plan (:class:`EdgePlan`) is ``accumulate_grad_batches``, one or two wrappers, the scaler's settings and epochs of
batches of calls (:class:`EdgeCall`). Each call's loss is built from the recipe's current scale so that its scaled
backward lands at a chosen height (:data:`HEIGHTS`): ``edge`` (0.6 of float16's largest value at the recipe's
``loss / N``: finite for the recipe, beyond float16 at ``N`` times that), ``low``, or ``over`` (beyond float16 even
for the recipe, which skips the window and backs off). :func:`run_edge_plan` drives a plan through the
implementation and the recipe (:class:`.plain_loop.PlainWindows`) side by side and compares them after every call
[AMP-007]. :func:`explicit_plan` gives every window shape for one ``N``; :func:`draw_plan` draws plans (hypothesis).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, cast

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    assert_params_close,
    call_step,
    cell_device,
    oracle_autocast,
    oracle_step_done,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import PlainWindows
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn

__all__ = [
    "DIRECTION",
    "FLOAT16_MAX",
    "HEIGHTS",
    "EdgeCall",
    "EdgePlan",
    "Level",
    "Parts",
    "draw_plan",
    "edge_inputs",
    "explicit_plan",
    "loss_under",
    "part_optimizer",
    "run_edge_plan",
]

MakeContext = Callable[..., TrainingContext]
A, S, SKIP = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE
FLOAT16_MAX = float(torch.finfo(torch.float16).max)

Level = Literal["low", "edge", "over"]
HEIGHTS: dict[Level, float] = {"low": 0.05, "edge": 0.6, "over": 1.5}
"""How high each micro-step's scaled backward reaches at the recipe's ``loss / N``, as a fraction of float16's max."""


@dataclass(frozen=True)
class EdgeCall:
    """One ``step()`` call: which wrapper, ``make_optimizer_step``, how high its backward reaches, in which form."""

    wrapper: int
    make_optimizer_step: bool | None
    level: Level
    form: Literal["closure", "backward"]

    def __str__(self) -> str:
        flag = {None: "n", True: "T", False: "F"}[self.make_optimizer_step]
        return f"{'AB'[self.wrapper]}{flag}{self.level[0]}{self.form[0]}"


@dataclass(frozen=True)
class EdgePlan:
    """A run: ``accumulate_grad_batches``, one or two wrappers, the scaler's settings, epochs of batches of calls."""

    accumulate: int
    wrappers: int
    scaler: GradScalerSettings
    epochs: tuple[tuple[tuple[EdgeCall, ...], ...], ...]

    def __str__(self) -> str:
        epochs = " | ".join(" ".join(",".join(map(str, batch)) or "-" for batch in epoch) for epoch in self.epochs)
        scaler = f"init_scale=2**{int(self.scaler.init_scale).bit_length() - 1}, growth_interval="
        return f"N={self.accumulate}, {self.wrappers} wrapper(s), {scaler}{self.scaler.growth_interval}: {epochs}"


class Parts(torch.nn.ModuleList):
    """One part per wrapper: two bias-free linear maps summed (two parameter groups), nothing shared."""

    def __init__(self, count: int) -> None:
        super().__init__(torch.nn.ModuleList(torch.nn.Linear(4, 2, bias=False) for _ in range(2)) for _ in range(count))
        generator = torch.Generator().manual_seed(41)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


DIRECTION = (1.0, -1.0)
"""The loss's gradient with respect to each output: every micro-batch row pushes the same height into float16."""


def edge_inputs(count: int) -> list[torch.Tensor]:
    """Small inputs: a gradient of height ``h`` at the outputs gives weight gradients of at most ``h / 2``."""
    generator = torch.Generator().manual_seed(43)
    return [(torch.rand(4, 4, generator=generator) - 0.5) * 0.25 for _ in range(count)]


def part_optimizer(model: Parts, index: int) -> torch.optim.Optimizer:
    """Part ``index``'s optimizer over its two parameter groups (the second with another lr): SGD momentum, or Adam."""
    first, second = cast(torch.nn.ModuleList, model[index])
    groups: list[dict[str, Any]] = [
        {"params": list(first.parameters())},
        {"params": list(second.parameters()), "lr": 2e-3},
    ]
    if index == 0:
        return torch.optim.SGD(groups, lr=1e-3, momentum=0.9)
    return torch.optim.Adam(groups, lr=1e-3)


def loss_under(
    autocast: AbstractContextManager[object],
    model: Parts,
    index: int,
    x: torch.Tensor,
    factor: float = 1e-2,
    factors: list[float] | None = None,
) -> torch.Tensor:
    """Part ``index``'s loss on ``x``, its forward under ``autocast``; ``factors`` receives its backward's factor."""
    first, second = cast(torch.nn.ModuleList, model[index])
    with autocast:
        out = first(x) + second(x)
        loss: torch.Tensor = (out.float() * torch.tensor(DIRECTION, device=out.device)).sum() * factor
    if factors is not None:
        loss.register_hook(lambda grad: factors.append(float(grad)))
    return loss


def run_edge_plan(make_context: MakeContext, cell: Cell, plan: EdgePlan) -> None:
    """Drive ``plan`` through the implementation and the recipe side by side; compare after every call.

    The recipe is :class:`PlainWindows` on a copy of the model: one ``GradScaler`` updated once per batch in which an
    optimizer stepped, each window closed where the call's flag or the schedule (``N``, the epoch's last batch) says.
    """
    base, n = Parts(plan.wrappers), plan.accumulate
    oracle = oracle_copy(base, cell)
    assert isinstance(oracle, Parts)
    scaler = GradScaler(cell_device(cell).type, **plan.scaler.as_kwargs())
    recipe = PlainWindows(cell, [part_optimizer(oracle, index) for index in range(plan.wrappers)], scaler, n)
    context = make_context(accumulate_grad_batches=n, grad_scaler=plan.scaler)
    model = context.prepare_module(copy.deepcopy(base))
    assert isinstance(model, Parts)
    wrappers = [context.wrap(part_optimizer(model, index)) for index in range(plan.wrappers)]
    inputs = [x.to(cell_device(cell)) for x in edge_inputs(max(len(epoch) for epoch in plan.epochs))]
    factors: list[float] = []
    for epoch_idx, epoch in enumerate(plan.epochs):
        for batch_idx, calls in enumerate(epoch):
            is_last, x = batch_idx == len(epoch) - 1, inputs[batch_idx]
            with context.batch(batch_idx, is_last=is_last):
                for call in calls:
                    factor = HEIGHTS[call.level] * FLOAT16_MAX * n / scaler.get_scale()
                    wrapper = wrappers[call.wrapper]
                    loss_of = partial(loss_under, context.autocast(), model, call.wrapper, x, factor, factors)
                    call_step(wrapper, call.form, loss_of, call.make_optimizer_step)
                    recipe.backward(call.wrapper, loss_under(oracle_autocast(cell), oracle, call.wrapper, x, factor))
                    closes = call.make_optimizer_step
                    closes = (batch_idx + 1) % n == 0 or is_last if closes is None else closes
                    want = (S if recipe.step(call.wrapper) else SKIP) if closes else A
                    if closes:
                        oracle_step_done(cell)
                    where = f"{plan}; epoch {epoch_idx}, batch {batch_idx}, {'AB'[call.wrapper]}'s {call.level} call"
                    assert wrapper.last_outcome is want, (
                        f"{where}: the call's outcome was {wrapper.last_outcome}, the recipe's {want} (AMP-007: each "
                        "backward propagates scaler.scale(loss / accumulate_grad_batches), so a window the recipe "
                        "applies is applied and one it skips is skipped)"
                    )
                    assert factors == recipe.scales, (
                        f"{where}: the backward passes propagated their losses times {factors}, the recipe's "
                        f"scaler.scale(loss / {n}) times {recipe.scales}"
                    )
            recipe.update()
            what = f"{plan}; after epoch {epoch_idx}, batch {batch_idx}"
            assert_params_close(model, oracle, cell, f"{what} (AMP-007, ACC-001: each window's mean applied)")


def explicit_plan(accumulate: int) -> EdgePlan:
    """Windows near the range for ``N = accumulate``: full, cut short, made longer, skipped, flushed; two wrappers.

    Epoch 0 (``N + 3`` batches): A follows the schedule (a full window, then the epoch's last batches flush a
    partial one), its micro-steps at the edge, one ``over`` in its second window (skipped by the recipe too; the
    scale backs off while B's window is open). B cuts its first window short with True after one micro-step, then
    keeps one open past the schedule with False and closes it with True (a window longer than N). Epoch 1: both in
    the backward-then-step form, a window cut short and one flushed. Growth every two steps.
    """
    n, epoch0 = accumulate, []
    for b in range(n + 3):
        a = EdgeCall(0, None, "over" if b == n + 1 else "edge", "closure" if b % 2 == 0 else "backward")
        inner = 0 < b < n + 2  # B's window kept open by False, between its first and last batch
        bee = EdgeCall(1, not inner, "low" if b == n + 2 else "edge", "backward" if inner and b % 2 else "closure")
        epoch0.append((a, bee) if b % 2 == 0 else (bee, a))
    epoch1 = tuple(
        (
            EdgeCall(0, True if b == 0 else None, "edge", "backward"),
            EdgeCall(1, None, "edge" if b else "low", "backward"),
        )
        for b in range(max(2, n))
    )
    settings_ = GradScalerSettings(init_scale=2.0**10, growth_interval=2)
    return EdgePlan(accumulate=n, wrappers=2, scaler=settings_, epochs=(tuple(epoch0), epoch1))


def draw_plan(draw: DrawFn) -> EdgePlan:
    """A plan drawn for ``st.composite``: ``N`` of 1 to 4, one or two wrappers, any flags, heights, forms, scales."""
    from hypothesis import strategies as st

    accumulate = draw(st.integers(1, 4))
    wrappers = draw(st.integers(1, 2))
    init_scale = draw(st.sampled_from([2.0**10, 2.0**16]))
    growth_interval = draw(st.sampled_from([1, 3, 1000]))
    levels: st.SearchStrategy[Level] = st.sampled_from(["edge", "edge", "edge", "low", "over"])
    flags = st.sampled_from([None, None, None, True, False])
    forms: st.SearchStrategy[Literal["closure", "backward"]] = st.sampled_from(["closure", "backward"])
    epochs = []
    for _ in range(draw(st.integers(1, 2))):
        batches = []
        for _ in range(draw(st.integers(1, 7))):
            order = draw(st.permutations(list(range(wrappers))))
            calls = tuple(
                EdgeCall(index, draw(flags), draw(levels), draw(forms)) for index in order if draw(st.integers(0, 5))
            )
            batches.append(calls)
        epochs.append(tuple(batches))
    settings_ = GradScalerSettings(init_scale=init_scale, growth_interval=growth_interval)
    return EdgePlan(accumulate, wrappers, settings_, tuple(epochs))
