"""Checks of 16-mixed as torch's AMP recipe runs it: headroom per micro-step, and no unscaled backward in a closure.

AMP-007: each backward propagates the recipe's ``scaler.scale(loss / N)`` (``N = accumulate_grad_batches``), so a
window near float16's range is applied or skipped as the recipe's, and the real step applies the window's mean
whatever its length. The losses here are built from the oracle's current scale so that each micro-step's scaled
backward lands at a chosen height: ``edge`` (0.6 of float16's largest value at the recipe's ``loss / N``: finite
for the recipe, beyond float16 at ``N`` times that), ``low``, or ``over`` (beyond float16 even for the recipe, which
skips the window and backs off). AMP-008: a closure's backward that did not go through the wrapper is refused.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any, Literal, cast

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import assert_same_grads, assert_same_values, grads, param_values
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    assert_discard_note,
    assert_params_close,
    assert_same_state,
    call_step,
    cell_device,
    failure_settings,
    oracle_autocast,
    oracle_step_done,
    refuses,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.plain_loop import PlainWindows
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

try:
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import strategies as st

    HYPOTHESIS_MISSING: str | None = None
except ImportError as exc:  # the suite's other checks run without it
    HYPOTHESIS_MISSING = f"hypothesis is not installed ({exc}); pip install hypothesis"

if TYPE_CHECKING:
    from hypothesis.strategies import DrawFn

MakeContext = Callable[..., TrainingContext]
A, S, SKIP = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE
FLOAT16_MAX = float(torch.finfo(torch.float16).max)
EAGER = ("cpu", "cuda")

Level = Literal["low", "edge", "over"]
HEIGHTS: dict[Level, float] = {"low": 0.05, "edge": 0.6, "over": 1.5}
"""How high each micro-step's scaled backward reaches at the recipe's ``loss / N``, as a fraction of float16's max."""


# -- the plan of a run ----------------------------------------------------------------------------------------


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


class _Parts(torch.nn.ModuleList):
    """One part per wrapper: two bias-free linear maps summed (two parameter groups), nothing shared."""

    def __init__(self, count: int) -> None:
        super().__init__(torch.nn.ModuleList(torch.nn.Linear(4, 2, bias=False) for _ in range(2)) for _ in range(count))
        generator = torch.Generator().manual_seed(41)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.3)


DIRECTION = (1.0, -1.0)
"""The loss's gradient with respect to each output: every micro-batch row pushes the same height into float16."""


def _inputs(count: int) -> list[torch.Tensor]:
    """Small inputs: a gradient of height ``h`` at the outputs gives weight gradients of at most ``h / 2``."""
    generator = torch.Generator().manual_seed(43)
    return [(torch.rand(4, 4, generator=generator) - 0.5) * 0.25 for _ in range(count)]


def _optimizer(model: _Parts, index: int) -> torch.optim.Optimizer:
    first, second = cast(torch.nn.ModuleList, model[index])
    groups: list[dict[str, Any]] = [
        {"params": list(first.parameters())},
        {"params": list(second.parameters()), "lr": 2e-3},
    ]
    if index == 0:
        return torch.optim.SGD(groups, lr=1e-3, momentum=0.9)
    return torch.optim.Adam(groups, lr=1e-3)


def _loss_under(
    autocast: AbstractContextManager[object],
    model: _Parts,
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


def _run_edge_plan(make_context: MakeContext, cell: Cell, plan: EdgePlan) -> None:
    """Drive ``plan`` through the implementation and the recipe side by side; compare after every call.

    The recipe is :class:`PlainWindows` on a copy of the model: one ``GradScaler`` updated once per batch in which an
    optimizer stepped, each window closed where the call's flag or the schedule (``N``, the epoch's last batch) says.
    """
    base, n = _Parts(plan.wrappers), plan.accumulate
    oracle = oracle_copy(base, cell)
    assert isinstance(oracle, _Parts)
    scaler = GradScaler(cell_device(cell).type, **plan.scaler.as_kwargs())
    recipe = PlainWindows(cell, [_optimizer(oracle, index) for index in range(plan.wrappers)], scaler, n)
    context = make_context(accumulate_grad_batches=n, grad_scaler=plan.scaler)
    model = context.prepare_module(copy.deepcopy(base))
    assert isinstance(model, _Parts)
    wrappers = [context.wrap(_optimizer(model, index)) for index in range(plan.wrappers)]
    inputs = [x.to(cell_device(cell)) for x in _inputs(max(len(epoch) for epoch in plan.epochs))]
    factors: list[float] = []
    for epoch_idx, epoch in enumerate(plan.epochs):
        for batch_idx, calls in enumerate(epoch):
            is_last, x = batch_idx == len(epoch) - 1, inputs[batch_idx]
            with context.batch(batch_idx, is_last=is_last):
                for call in calls:
                    factor = HEIGHTS[call.level] * FLOAT16_MAX * n / scaler.get_scale()
                    wrapper = wrappers[call.wrapper]
                    loss_of = partial(_loss_under, context.autocast(), model, call.wrapper, x, factor, factors)
                    call_step(wrapper, call.form, loss_of, call.make_optimizer_step)
                    recipe.backward(call.wrapper, _loss_under(oracle_autocast(cell), oracle, call.wrapper, x, factor))
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


# -- the explicit plans: every window shape for N = 1 to 4 ---------------------------------------------------------


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


AMP007_VARIES: dict[str, tuple[str, ...]] = {
    "window": (
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "partial, flushed by the last batch",
        "open while another optimizer steps",
        "open across a scale change",
    ),
    "make_optimizer_step": ("True", "False", "None"),
    "position": ("inside batch()",),
    "wrappers": ("1", "2"),
    "param_groups": ("2 with other hyper-parameters",),
    "optimizer": ("SGD momentum", "Adam"),
    "call_form": ("closure, wrapper.backward", "backward, then step()"),
    "loss_scale": ("backed off", "grown", "settings given to the factory"),
}


@pytest.mark.requirement("AMP-007", "ACC-001", "AMP-004", "AMP-006", "STEP-004")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("accumulate", [1, 2, 3, 4])
@pytest.mark.varies(**(AMP007_VARIES | {"wrappers": ("2",)}))
def test_windows_near_the_float16_range_follow_the_recipe(
    make_context: MakeContext, cell: Cell, accumulate: int
) -> None:
    """Windows of 1 to 4 near float16's range: applied, skipped and scaled as ``scaler.scale(loss / N)`` makes them.

    One explicit plan per ``N`` (see :func:`explicit_plan`): every window shape, two wrappers with two parameter
    groups each (SGD with momentum, Adam), both call forms, a back-off and growth. After every call the outcome and
    the factors the backward passes propagated are the recipe's; after every batch, the parameters.
    """
    _run_edge_plan(make_context, cell, explicit_plan(accumulate))


# -- generated plans --------------------------------------------------------------------------------------------


GENERATED_PLANS = 25
"""Generated plans per eager cell in a plain run (``--property-examples=N`` runs ``N``)."""


def _draw_plan(draw: DrawFn) -> EdgePlan:
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


@pytest.mark.requirement("AMP-007", "ACC-001", "AMP-004", "AMP-006", "STEP-004")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.varies(**AMP007_VARIES)
def test_generated_windows_near_the_float16_range(
    make_context: MakeContext, cell: Cell, request: pytest.FixtureRequest
) -> None:
    """Generated plans: ``N`` of 1 to 4, one or two wrappers, any flags, heights, forms, scale growth and back-off."""
    if HYPOTHESIS_MISSING is not None:
        unavailable(HYPOTHESIS_MISSING)
    requested = request.config.getoption("property_examples", default=None)

    @settings(
        max_examples=int(requested) if requested else GENERATED_PLANS,
        derandomize=True,
        database=None,
        deadline=None,
        phases=(Phase.generate,) + ((Phase.shrink,) if requested else ()),
        report_multiple_bugs=False,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @given(plan=st.composite(_draw_plan)())
    def generated(plan: EdgePlan) -> None:
        _run_edge_plan(make_context, cell, plan)

    generated()


# -- AMP-008: a closure's backward that missed the wrapper ----------------------------------------------------------


UNSCALED_FORMS: dict[str, Callable[[Any, torch.Tensor, torch.Tensor], None]] = {
    "loss.backward()": lambda wrapper, loss, other: loss.backward(),
    "torch.autograd.backward": lambda wrapper, loss, other: torch.autograd.backward([loss]),
    "wrapper.backward, then loss.backward()": lambda wrapper, loss, other: (
        wrapper.backward(other),
        loss.backward(),
    )[0],
    "loss.backward(), then wrapper.backward": lambda wrapper, loss, other: (
        loss.backward(),
        wrapper.backward(other),
    )[0],
}
"""What a closure runs instead of (or besides) a wrapper's backward of its loss."""


def _retry_recipe(base: _Parts, cell: Cell, inputs: list[torch.Tensor], *, discard: bool, closing: bool) -> _Parts:
    """The recipe of the refused-call check on a copy of ``base``, as :class:`PlainWindows` with a default scaler.

    A's windows {0, 1}, {2} (``closing``) or {0, 1, 2}, without batch 0 under ``discard``; B's {0, 2}.
    """
    recipe = oracle_copy(base, cell)
    assert isinstance(recipe, _Parts)
    scaler = GradScaler(cell_device(cell).type)
    loop = PlainWindows(cell, [_optimizer(recipe, index) for index in range(2)], scaler, 3)
    first = ((1, False),) if discard else ((0, False), (1, False))
    for batch, calls in enumerate((first, ((0, closing),), ((0, True), (1, True)))):
        for index, closes in calls:
            loop.backward(index, _loss_under(oracle_autocast(cell), recipe, index, inputs[batch]))
            if closes:
                loop.step(index)
        loop.update()
    return recipe


def _assert_left_by_the_refused_call(
    context: TrainingContext,
    wrappers: tuple[Any, Any],
    params: Sequence[torch.Tensor],
    before: tuple[list[torch.Tensor | None], list[torch.Tensor], StepOutcome | None, object],
    error: BaseException,
    discard: bool,
    what: str,
) -> None:
    """What a refused call of ``wrappers[0]`` leaves: its window as before (gone under ``discard``), all else as before.

    ``before``: the gradients and values of ``params``, the outcome and the context's state (``None``: not taken).
    """
    (wrapper, other), (held, values, outcome, state) = wrappers, before
    own = [p for group in wrapper.param_groups for p in group["params"]]
    gone = [discard and any(param is p for p in own) for param in params]  # the discarded window (FAIL-003)
    want = [None if discarded else grad for discarded, grad in zip(gone, held, strict=True)]
    assert_same_grads(grads(params), want, f"{what} (CLOS-003: the window as before the call)")
    assert_same_values(param_values(params), values, what)
    if discard:
        assert wrapper.last_outcome is StepOutcome.DISCARDED, f"{what}: last_outcome is {wrapper.last_outcome}"
        assert_discard_note(error, wrapper.optimizer, (1, 2), what)
    else:
        assert wrapper.last_outcome is outcome, f"{what}: last_outcome became {wrapper.last_outcome}"
    assert other.last_outcome is StepOutcome.ACCUMULATED, f"{what}: the other wrapper's outcome changed"
    if state is not None:
        assert_same_state(context.state_dict(), state, f"{what}, context.state_dict()")


@pytest.mark.requirement("AMP-008", "CLOS-003", "AMP-007", "FAIL-002", "FAIL-003", "FAIL-004")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("closing", [False, True], ids=["accumulating", "closing"])
@pytest.mark.parametrize("unscaled", list(UNSCALED_FORMS))
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    call_form=("closure, loss.backward",),
    faults=("invalid argument", "raising closure after its backward"),
    make_optimizer_step=("True", "False"),
    window=("k >= 2 micro-steps",),
    wrappers=("2",),
    on_failure=("discard", "restore"),
)
def test_unscaled_backward_in_a_closure_is_refused(
    make_context: MakeContext,
    cell: Cell,
    implementation: ImplementationInfo[Any],
    unscaled: str,
    closing: bool,
    on_failure: str,
) -> None:
    """A 16-mixed closure whose backward missed the wrapper's scaling is refused; the call fails as a raising closure.

    The window holds one micro-step already, and the refused call's backward wrote into it. Under ``"restore"`` the
    call leaves its gradients, the parameters, the outcome and (where checkpointing is claimed) the context's state
    as they were; under ``"discard"`` the window is gone (every gradient ``None``, ``DISCARDED``, a note on the
    exception) and the parameters as they were. The corrected retry then gives the recipe's result over the windows
    each policy leaves. The other wrapper's open window is untouched throughout.
    """
    discard = on_failure == "discard"
    context = make_context(accumulate_grad_batches=3, **failure_settings(on_failure))
    base = _Parts(2)
    model = context.prepare_module(copy.deepcopy(base))
    assert isinstance(model, _Parts)
    wrapper, other = (context.wrap(_optimizer(model, index)) for index in range(2))
    inputs = [x.to(cell_device(cell)) for x in _inputs(3)]

    def good(index: int, x: torch.Tensor) -> Callable[[], None]:
        target = (wrapper, other)[index]
        return lambda: target.backward(_loss_under(context.autocast(), model, index, x))

    with context.batch(0):
        wrapper.step(good(0, inputs[0]), make_optimizer_step=False)
        other.step(good(1, inputs[0]), make_optimizer_step=False)
    params = list(model.parameters())
    checkpointing = "checkpointing" in implementation.features
    state = copy.deepcopy(context.state_dict()) if checkpointing and not discard else None
    before = (grads(params), param_values(params), wrapper.last_outcome, state)

    def bad() -> None:
        loss, other_loss = (_loss_under(context.autocast(), model, 0, inputs[1]) for _ in range(2))
        UNSCALED_FORMS[unscaled](wrapper, loss, other_loss)

    with context.batch(1):
        with refuses(
            RuntimeError,
            f"a 16-mixed step() ({'closing' if closing else 'accumulating'}) whose closure ran {unscaled}",
            "AMP-008: a closure's backward that did not go through a wrapper's backward is refused, naming "
            "opt.backward(loss)",
            match=r"opt\.backward\(loss\)",
        ) as raised:
            wrapper.step(bad, make_optimizer_step=closing)
        what = f"a refused step() whose closure ran {unscaled} (on_failure={on_failure!r})"
        _assert_left_by_the_refused_call(context, (wrapper, other), params, before, raised.value, discard, what)
        wrapper.step(good(0, inputs[1]), make_optimizer_step=closing)
    with context.batch(2, is_last=True):
        wrapper.step(good(0, inputs[2]), make_optimizer_step=True)
        other.step(good(1, inputs[2]), make_optimizer_step=True)

    recipe = _retry_recipe(base, cell, inputs, discard=discard, closing=closing)
    assert_params_close(model, recipe, cell, f"after the refused call ({unscaled}) and its corrected retry")


PENALTY_SCALER = GradScalerSettings(init_scale=2.0**8)
"""A scale at which the penalties' double backward stays finite in float16."""


@pytest.mark.requirement("AMP-008", "AMP-007")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("of", ["inputs", "parameters"])
@pytest.mark.varies(call_form=("closure, wrapper.backward",), backward_args=("create_graph", "inputs"))
def test_a_gradient_penalty_through_autograd_grad_is_not_refused(
    make_context: MakeContext, cell: Cell, of: str
) -> None:
    """A closure that takes ``torch.autograd.grad`` (a gradient penalty), then ``wrapper.backward``, is accepted.

    The penalty is on the gradient with respect to the inputs (WGAN-GP) or to the parameters (a gradient-norm
    regulariser, whose ``torch.autograd.grad`` computes the very gradients the window holds). Neither writes a
    ``.grad``: only what reaches the gradients is told apart. The result is the recipe's: the penalty's gradient
    scaled with the loss.
    """
    context = make_context(accumulate_grad_batches=2, grad_scaler=PENALTY_SCALER)
    base = _Parts(1)
    model = context.prepare_module(copy.deepcopy(base))
    assert isinstance(model, _Parts)
    wrapper = context.wrap(_optimizer(model, 0))
    inputs = [x.to(cell_device(cell)) for x in _inputs(2)]

    def penalised(module: _Parts, x: torch.Tensor) -> torch.Tensor:
        x = x.clone().requires_grad_(of == "inputs")
        loss = _loss_under(nullcontext(), module, 0, x)
        wrt = [x] if of == "inputs" else list(module.parameters())
        gradients = torch.autograd.grad(loss, wrt, create_graph=True)
        return loss + sum((grad.pow(2).sum() for grad in gradients), torch.zeros((), device=x.device))

    for batch_idx, x in enumerate(inputs):
        with context.batch(batch_idx, is_last=batch_idx == 1):

            def closure(x: torch.Tensor = x) -> None:
                with context.autocast():
                    loss = penalised(model, x)
                wrapper.backward(loss)

            wrapper.step(closure)
    assert wrapper.last_outcome is S, (
        f"the window of two with a gradient penalty on the {of} closed as {wrapper.last_outcome}"
    )
    recipe = oracle_copy(base, cell)
    assert isinstance(recipe, _Parts)
    loop = PlainWindows(
        cell, [_optimizer(recipe, 0)], GradScaler(cell_device(cell).type, **PENALTY_SCALER.as_kwargs()), 2
    )
    for x in inputs:
        with oracle_autocast(cell):
            loss = penalised(recipe, x)
        loop.backward(0, loss)
    loop.step(0)
    loop.update()
    assert_params_close(model, recipe, cell, f"a window of two whose closures took a gradient penalty on the {of}")


@pytest.mark.requirement("CKPT-003", "AMP-007")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.varies(copies=("checkpoint",), faults=("refused load",), window=("k >= 2 micro-steps", "1 micro-step"))
def test_open_window_state_of_another_divisor_is_refused(make_context: MakeContext, cell: Cell) -> None:
    """A state taken with a window open under ``accumulate_grad_batches=2`` does not load where it is 3.

    Its gradients carry the loss divisor 2 (AMP-007); the context refuses it with ``ValueError`` and changes nothing.
    The same state loads where it is 2, and a state with every window closed loads anywhere.
    """

    def build(accumulate: int) -> tuple[TrainingContext, _Parts, Any]:
        context = make_context(accumulate_grad_batches=accumulate)
        model = context.prepare_module(_Parts(1))
        assert isinstance(model, _Parts)
        return context, model, context.wrap(_optimizer(model, 0))

    context, model, wrapper = build(2)
    x = _inputs(1)[0].to(cell_device(cell))
    with context.batch(0):
        wrapper.step(lambda: wrapper.backward(_loss_under(context.autocast(), model, 0, x)), make_optimizer_step=False)
    open_state = copy.deepcopy(context.state_dict())
    other, other_model, other_wrapper = build(3)
    with other.batch(0):
        other_wrapper.step(
            lambda: other_wrapper.backward(_loss_under(other.autocast(), other_model, 0, x)), make_optimizer_step=True
        )
    before = copy.deepcopy(other.state_dict())
    held = grads(other_model.parameters())
    with refuses(
        ValueError,
        "load_state_dict of a 16-mixed state with a window open under accumulate_grad_batches=2, where it is 3",
        "CKPT-003, AMP-007: the open window's gradients carry another loss divisor; refused before anything changes",
    ):
        other.load_state_dict(open_state)
    assert_same_state(other.state_dict(), before, "after the refused load, context.state_dict()")
    assert_same_grads(grads(other_model.parameters()), held, "the refused load changed gradients")
    same, _, _ = build(2)
    same.load_state_dict(open_state)
    closed = copy.deepcopy(before)
    fresh, _, _ = build(3)
    fresh.load_state_dict(closed)
    anywhere, _, _ = build(4)
    anywhere.load_state_dict(closed)
