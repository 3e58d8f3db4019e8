"""Checks of the rules that make a call all or nothing, or refuse it before anything changes.

Refused arguments, failed inner steps, re-entered steps, mid-iteration checkpoints and copies, and what
``unscale_gradients()`` forbids until the window's closing step.

Every expected value comes from a plain PyTorch loop beside the check (a bare optimizer, ``torch.autocast`` and,
under 16-mixed, a plain ``torch.amp.GradScaler``) or from hand arithmetic (loss scales worked out from the scaler
settings); never from the implementation under test.
"""

from __future__ import annotations

import copy
import gc
import io
import math
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    Snapshot,
    assert_same_grads,
    assert_same_values,
    assert_unchanged,
    grads,
    param_values,
    snapshot,
)
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    ON_FAILURE,
    Batch,
    FlakyAdam,
    FlakySGD,
    Halves,
    PlannedFailure,
    assert_discard_note,
    assert_params_close,
    assert_same_state,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    make_model,
    mse,
    oracle_step_done,
    refuses,
    run_steps,
    scaler_settings,
)
from lightning_optimizer.conformance.oracles import (
    expected_outcomes,
    oracle_copy,
    oracle_mean_steps,
)
from lightning_optimizer.conformance.plain_loop import (
    clipper,
    oracle_loss,
    plain_scaler,
    real_step,
    scaled_backward,
    train_windows,
    update_scaler,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, SKIP = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE

EAGER = ("cpu", "cuda")
"""Where the checks that train windows against an oracle run: on XLA every new graph compiles, which takes these
checks 2 to 8 s per cell there; the checks that only construct or refuse run on XLA too."""

SGD_LR = 10.0
"""Large enough that a window's mean taken over a wrong length, or a gradient left scaled, moves the parameters far
beyond every precision's tolerance."""
ADAM_LR = 0.01
GROWING = GradScalerSettings(init_scale=2.0**10, growth_interval=1)
"""Under 16-mixed: the scale doubles after every iteration in which an optimizer stepped and nothing overflowed, and
halves after one that overflowed: a scaler update too many, too few or with the wrong found-inf shows in the scales."""


# -- ERR-008: keyword arguments the inner step cannot take ---------------------------------------------------


class _KeywordSGD(torch.optim.SGD):
    """An SGD whose ``step`` takes one keyword argument of its own, and records what it received."""

    received: list[float]

    def step(self, closure: Any = None, *, lr_factor: float = 1.0) -> Any:
        self.received.append(lr_factor)
        for group in self.param_groups:
            group["lr"] *= lr_factor
        try:
            return super().step(closure)
        finally:
            for group in self.param_groups:
                group["lr"] /= lr_factor


def _counted_closure(
    context: TrainingContext, model: torch.nn.Module, wrapper: Any, batch: Batch, cell: Cell, calls: list[int]
) -> Callable[[], None]:
    """A closure that backpropagates the batch's loss through ``wrapper``, and counts its runs in ``calls``."""

    def closure() -> None:
        calls.append(1)
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell)) * LOSS_FACTOR
        wrapper.backward(loss)

    return closure


def _adam_refuses_every_keyword(make_context: MakeContext, cell: Cell, batch: Batch, calls: list[int]) -> None:
    """An empty window: Adam's ``step(closure=None)`` takes no keyword at all, so ``lr_factor`` is refused [ERR-008]."""
    context = make_context()
    model = context.prepare_module(make_model())
    adam = context.wrap(torch.optim.Adam(model.parameters(), lr=ADAM_LR))
    before = param_values(list(model.parameters()))
    for make_step in (True, None, False):
        with refuses(
            TypeError,
            f"adam.step(closure, make_optimizer_step={make_step}, lr_factor=2.0) on an empty window (Adam's step() "
            "takes no lr_factor)",
            "ERR-008: keywords that the inner step() cannot take are refused with TypeError before anything runs",
        ):
            closure = _counted_closure(context, model, adam, batch, cell, calls)
            adam.step(closure, make_optimizer_step=make_step, lr_factor=2.0)
        assert calls == [], f"step(lr_factor=2.0, make_optimizer_step={make_step}) on Adam ran the closure"
        assert adam.last_outcome is None, f"a refused step() recorded the outcome {adam.last_outcome}"
        assert all(p.grad is None for p in model.parameters()), "a refused step() left gradients"
        assert_same_values(param_values(list(model.parameters())), before, "a refused step() on Adam")
        assert not adam.optimizer.state, "a refused step() made Adam create its state"


def _refused_with_a_window_open(
    context: TrainingContext, model: torch.nn.Module, wrapper: Any, batch: Batch, cell: Cell, calls: list[int]
) -> None:
    """Keywords the inner step (``lr_factor`` only) cannot take, on calls that accumulate or step: all refused."""
    params, inner = list(model.parameters()), wrapper.optimizer
    window, values = grads(params), param_values(params)
    bad: list[dict[str, Any]] = [{"lr_facter": 2.0}, {"lr_factor": 2.0, "nesterov": True}, {"set_to_none": True}]
    why = (
        "ERR-008: keywords that the inner step() cannot take are refused with TypeError before anything runs, on a "
        "call that only accumulates too"
    )
    for make_step in (False, None, True):
        for kwargs in bad:
            what = f"step({', '.join(kwargs)}, make_optimizer_step={make_step}) with a window open"
            given = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
            with refuses(
                TypeError,
                f"wrapper.step(closure, make_optimizer_step={make_step}, {given}) with a window open (the inner "
                "step() takes lr_factor only)",
                why,
            ):
                closure = _counted_closure(context, model, wrapper, batch, cell, calls)
                wrapper.step(closure, make_optimizer_step=make_step, **kwargs)
            assert calls == [], f"{what} ran the closure"
            with refuses(
                TypeError,
                f"wrapper.step(make_optimizer_step={make_step}, {given}) with a window open (the inner step() "
                "takes lr_factor only)",
                why,
            ):
                wrapper.step(make_optimizer_step=make_step, **kwargs)
            assert inner.received == [], f"{what} reached the inner step"
            assert wrapper.last_outcome is A, f"{what} changed the outcome to {wrapper.last_outcome}"
            assert_same_grads(grads(params), window, what)
            assert_same_values(param_values(params), values, what)


@pytest.mark.requirement("ERR-008", "STEP-005")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(
    faults=("invalid argument",),
    window=("1 micro-step", "k >= 2 micro-steps"),
    make_optimizer_step=("True", "False", "None"),
    step_kwargs=("without gradients", "with gradients"),
    optimizer=("SGD", "Adam"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
)
def test_step_kwargs_the_inner_step_cannot_take(make_context: MakeContext, cell: Cell) -> None:
    """A keyword the inner ``step`` does not take is refused with ``TypeError`` before anything runs, on every call.

    On an empty window (Adam, whose ``step`` takes only ``closure``) and on an open one (an SGD whose ``step`` takes
    ``lr_factor``), for calls that would accumulate and calls that would step; the keyword the inner step takes is
    accepted on an accumulating call and reaches the closing step.
    """
    device, dtype = cell_device(cell), cell_dtype(cell)
    calls: list[int] = []
    batches = make_batches(2, seed=11)
    _adam_refuses_every_keyword(make_context, cell, batches[0], calls)
    # An open window of two micro-steps: SGD with a keyword of its own.
    context = make_context(accumulate_grad_batches=2)
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    inner = _KeywordSGD(model.parameters(), lr=SGD_LR)
    inner.received = []
    wrapper = context.wrap(inner)
    params = list(model.parameters())
    with context.batch(0):
        # accumulates: the keyword is fine
        wrapper.step(_counted_closure(context, model, wrapper, batches[0], cell, calls), lr_factor=3.0)
    assert wrapper.last_outcome is A, f"the first micro-step of a window of two: {wrapper.last_outcome}"
    assert inner.received == [], f"an accumulating call reached the inner step with {inner.received}"
    calls.clear()
    with context.batch(1):
        _refused_with_a_window_open(context, model, wrapper, batches[1], cell, calls)
        # The backward-then-step form: the refused step leaves the backward's gradients in the window.
        with context.autocast():
            loss = mse(model, batches[1], device, dtype) * LOSS_FACTOR
        wrapper.backward(loss)
        window = grads(params)
        with refuses(
            TypeError,
            "wrapper.step(make_optimizer_step=None, lr_facter=2.0) after the window's last backward (the inner "
            "step() takes lr_factor only)",
            "ERR-008: keywords that the inner step() cannot take are refused with TypeError before anything runs",
        ):
            wrapper.step(make_optimizer_step=None, lr_facter=2.0)
        assert_same_grads(grads(params), window, "a refused step(lr_facter=2.0) after the window's last backward")
        wrapper.step(make_optimizer_step=None, lr_factor=2.0)
    assert wrapper.last_outcome is S, f"after refused calls, the window did not close on time: {wrapper.last_outcome}"
    assert inner.received == [2.0], f"the inner step received lr_factor {inner.received}, expected [2.0] once"

    oracle_mean_steps([oracle_model], batches, cell, SGD_LR * 2.0, LOSS_FACTOR)
    assert_params_close(model, oracle_model, cell, "a window closed with lr_factor=2.0 after refused keywords")


# -- TXN-001: a real step whose inner step raises ------------------------------------------------------------


_OPTIMIZERS: dict[str, tuple[type[torch.optim.Optimizer], type[torch.optim.Optimizer], dict[str, Any]]] = {
    "SGD": (FlakySGD, torch.optim.SGD, {"lr": SGD_LR}),
    "SGD momentum": (FlakySGD, torch.optim.SGD, {"lr": SGD_LR, "momentum": 0.9}),
    "Adam": (FlakyAdam, torch.optim.Adam, {"lr": ADAM_LR}),
}
"""The flaky optimizer, its plain twin for the oracle, and their hyper-parameters."""


@dataclass(frozen=True)
class _Failure:
    """One epoch in which the closing step of one window fails once, then succeeds."""

    accumulate: int
    optimizer: str
    closure_form: bool
    batches: int
    failing: int
    """The batch whose call's inner step raises."""
    windows: tuple[tuple[int, ...], ...]
    """The windows the oracle trains under ``"restore"``, worked out by hand: the failed call adds nothing to its
    window, and the retry (a closing call, without a new backward in the backward-then-step form) closes it."""
    outcomes: tuple[StepOutcome, ...]
    """``last_outcome`` after each batch under ``"restore"`` (16-mixed skips none: the losses are small)."""
    discard_windows: tuple[tuple[int, ...], ...]
    """The windows under ``"discard"``: the failed call's window is gone, and its retry (with a new backward, and
    ``unscale_gradients()`` again where the plan prepares) makes a window of the failing batch alone."""
    discard_outcomes: tuple[StepOutcome, ...]
    held: int
    """Micro-steps the failed window held before the failing call."""
    schedule: dict[int, bool | None] = field(default_factory=dict)
    clip: float | None = None
    unscale_first: bool = False
    """``unscale_gradients()`` prepares the window before its failing closing step (backward-then-step form)."""
    retry_in_next_batch: bool = False
    """The failed call is not retried: the next batch's call closes the window (without the failed micro-batch)."""


D = StepOutcome.DISCARDED
_FAILURES = {
    "window-1-closure": _Failure(
        1, "SGD momentum", True, 3, 1, ((0,), (1,), (2,)), (S, S, S), ((0,), (1,), (2,)), (S, S, S), held=0
    ),
    "window-3-closure-clipped": _Failure(
        3,
        "SGD",
        True,
        6,
        5,
        ((0, 1, 2), (3, 4, 5)),
        (A, A, S, A, A, S),
        ((0, 1, 2), (5,)),
        (A, A, S, A, A, S),
        held=2,
        clip=2e-4,
    ),
    "cut-short-backward-adam": _Failure(
        4,
        "Adam",
        False,
        7,
        5,
        ((0, 1, 2, 3), (4, 5), (6,)),
        (A, A, A, S, A, S, S),
        ((0, 1, 2, 3), (5,), (6,)),
        (A, A, A, S, A, S, S),
        held=1,
        schedule={5: True},
    ),
    "prepared-backward-clipped": _Failure(
        2,
        "SGD momentum",
        False,
        4,
        3,
        ((0, 1), (2, 3)),
        (A, S, A, S),
        ((0, 1), (3,)),
        (A, S, A, S),
        held=1,
        clip=2e-4,
        unscale_first=True,
    ),
    "retried-in-next-batch": _Failure(
        4,
        "SGD momentum",
        True,
        4,
        1,
        ((0, 2), (3,)),
        (A, A, S, S),
        ((2,), (3,)),
        (A, D, S, S),
        held=1,
        schedule={1: True, 2: True, 3: True},
        retry_in_next_batch=True,
    ),
}


def _oracle_windows(
    cell: Cell,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Batch],
    windows: Sequence[Sequence[int]],
    clip: float | None,
    settings: GradScalerSettings,
    accumulate_grad_batches: int,
) -> tuple[list[float], list[bool]]:
    """One step per window on its mean, unscaled, clipped; the scale of each backward pass and which windows stepped."""
    scales: list[float] = []
    clip_norm = None if clip is None else clipper("norm", clip)
    stepped = train_windows(
        cell,
        model,
        optimizer,
        batches,
        windows,
        plain_scaler(cell, settings),
        accumulate=accumulate_grad_batches,
        clip=clip_norm,
        scales=scales,
    )
    return scales, stepped


@dataclass
class _InnerFailureRun:
    """One wrapper's epoch in which the inner step of a closing call raises once (a :class:`_Failure` plan)."""

    plan: _Failure
    context: TrainingContext
    model: torch.nn.Module
    wrapper: Any
    inner: torch.optim.Optimizer
    batches: list[Batch]
    cell: Cell
    on_failure: str
    scenario: str
    scales: list[tuple[int, float]] = field(default_factory=list)
    """Under 16-mixed, each recorded backward pass's batch and scale."""

    def loss_of(self, batch_idx: int, record: bool) -> torch.Tensor:
        """The batch's loss under the context's autocast, its scale recorded (16-mixed, with ``record``)."""
        with self.context.autocast():
            loss = mse(self.model, self.batches[batch_idx], cell_device(self.cell), cell_dtype(self.cell)) * LOSS_FACTOR
        if self.cell.precision == "16-mixed" and record:
            loss.register_hook(lambda grad: self.scales.append((batch_idx, float(grad))))
        return loss

    def call(self, batch_idx: int, *, backward: bool = True, record: bool = True) -> None:
        """The planned call of ``batch_idx``, in the plan's form (its backward left out with ``backward=False``)."""
        plan, wrapper = self.plan, self.wrapper
        make_step = plan.schedule.get(batch_idx)
        if plan.closure_form:

            def closure() -> torch.Tensor:
                loss = self.loss_of(batch_idx, record)
                wrapper.backward(loss)
                return loss

            wrapper.step(closure, make_optimizer_step=make_step)
            return
        if backward:
            wrapper.backward(self.loss_of(batch_idx, record))
            if plan.unscale_first and batch_idx == plan.failing:
                wrapper.unscale_gradients()
        wrapper.step(make_optimizer_step=make_step)

    def fail(self, batch_idx: int, checkpointing: bool) -> None:
        """The failing call, what it leaves under the policy, and its retry (unless the next batch retries)."""
        plan, wrapper, params = self.plan, self.wrapper, list(self.model.parameters())
        discard = self.on_failure == "discard"
        if not plan.closure_form:
            wrapper.backward(self.loss_of(batch_idx, record=not discard))
            if plan.unscale_first:
                wrapper.unscale_gradients()
        outcome, window, values = wrapper.last_outcome, grads(params), param_values(params)
        state = copy.deepcopy(self.context.state_dict()) if checkpointing and not plan.unscale_first else None
        what = f"a closing step whose inner step raised ({self.scenario}, on_failure={self.on_failure!r})"
        self.inner.fail = True  # type: ignore[attr-defined]
        with refuses(
            PlannedFailure,
            f"a closing step() whose inner optimizer's step raises ({self.scenario}, on_failure={self.on_failure!r})",
            "TXN-001: the inner step's exception propagates out of step()",
        ) as raised:
            self.call(batch_idx, backward=False, record=False)
        self.inner.fail = False  # type: ignore[attr-defined]
        assert_same_values(param_values(params), values, what)
        if discard:
            assert_same_grads(grads(params), [None] * len(params), f"{what}, the discarded window (FAIL-003)")
            assert wrapper.last_outcome is D, f"{what}: last_outcome is {wrapper.last_outcome}, not DISCARDED"
            assert_discard_note(raised.value, self.inner, (plan.held, plan.held + 1), what)
            if plan.unscale_first:
                wrapper.zero_grad()  # the discarded window is no longer prepared: zero_grad() is allowed again
        else:
            assert_same_grads(grads(params), window, f"{what}, the window")
            assert wrapper.last_outcome is outcome, (
                f"{what} changed last_outcome from {outcome} to {wrapper.last_outcome}"
            )
            if state is not None:
                assert_same_state(self.context.state_dict(), state, f"{what}, context.state_dict()")
            if plan.unscale_first:
                with refuses(
                    RuntimeError,
                    f"wrapper.zero_grad() after unscale_gradients() and a failed closing step() ({self.scenario})",
                    "CLIP-002: the window is still prepared, and a zero_grad() before its closing step() is refused",
                ):
                    wrapper.zero_grad()  # still prepared: zero_grad() before the closing step is refused
                assert_same_grads(grads(params), window, f"{what}, then a refused zero_grad(), the prepared window")
        if not plan.retry_in_next_batch:
            self.call(batch_idx, backward=discard)


@pytest.mark.requirement("TXN-001", "STEP-004", "ACC-001", "FAIL-003", "FAIL-004")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("scenario", list(_FAILURES))
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True"),
    make_optimizer_step=("True", "None"),
    optimizer=("SGD", "SGD momentum", "Adam"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    clipping=("norm", "unscale_gradients() by hand"),
    loss_scale=("grown", "settings given to the factory"),
    position=("inside batch()",),
    faults=("raising inner step", "failing closing step of a prepared window"),
    on_failure=("discard", "restore"),
)
def test_failed_inner_step_leaves_the_window(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any], scenario: str, on_failure: str
) -> None:
    """The inner step of a closing call raises: the exception propagates, the window is what the policy leaves.

    Under ``"restore"`` the window is as before the call: its gradients (not averaged, unscaled or clipped, without
    the failed call's closure), its length, whether ``unscale_gradients()`` prepared it, ``last_outcome``, the step
    count and the loss scaler (the context's ``state_dict()`` where checkpointing is claimed) are unchanged; the
    retry, or the next batch's call, then applies the window's true mean. Under ``"discard"`` the window is gone
    (every gradient ``None``, ``last_outcome`` ``DISCARDED``, a note on the exception, a prepared window no longer
    prepared), and the loss scaler forgets the failed step's unscaling: the retry in the same batch (a new backward,
    ``unscale_gradients()`` again where the window was prepared) steps on the mean of its own window, unscaled once.
    Either way the parameters match a plain loop over the windows worked out by hand, and under 16-mixed every
    counted backward pass used the scale that the plain ``GradScaler`` had there.
    """
    plan = _FAILURES[scenario]
    discard = on_failure == "discard"
    windows = plan.discard_windows if discard else plan.windows
    counted = {batch_idx for window in windows for batch_idx in window}
    flaky_class, plain_class, hyper = _OPTIMIZERS[plan.optimizer]
    sixteen = cell.precision == "16-mixed"
    context = make_context(
        accumulate_grad_batches=plan.accumulate,
        gradient_clip_val=plan.clip,
        **scaler_settings(cell, GROWING),
        **failure_settings(on_failure),
    )
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    inner = flaky_class(model.parameters(), **hyper)
    wrapper = context.wrap(inner)
    batches = make_batches(plan.batches, seed=12)
    run = _InnerFailureRun(plan, context, model, wrapper, inner, batches, cell, on_failure, scenario)
    checkpointing = "checkpointing" in implementation.features
    outcomes = []
    for batch_idx in range(plan.batches):
        with context.batch(batch_idx, is_last=batch_idx == plan.batches - 1):
            if batch_idx == plan.failing:
                run.fail(batch_idx, checkpointing)
            else:
                run.call(batch_idx)
            outcomes.append(wrapper.last_outcome)

    oracle_optimizer = plain_class(oracle_model.parameters(), **hyper)
    want_scales, stepped = _oracle_windows(
        cell, oracle_model, oracle_optimizer, batches, windows, plan.clip, GROWING, plan.accumulate
    )
    want_outcomes = expected_outcomes(plan.discard_outcomes if discard else plan.outcomes, stepped)
    assert outcomes == want_outcomes, f"the calls took {outcomes}, expected {want_outcomes} ({scenario})"
    if sixteen:
        got_scales = [scale for batch_idx, scale in run.scales if batch_idx in counted]
        assert got_scales == want_scales, (
            f"the backward passes were scaled by {got_scales}; a plain GradScaler over the windows {windows} scales "
            f"them by {want_scales}: the failed step changed the loss scaler"
            + (" (under on_failure='discard' it must forget what it recorded of the failed step)" if discard else "")
        )
    assert_params_close(
        model, oracle_model, cell, f"after a failed inner step and its retry, the windows {windows} ({scenario})"
    )


# -- REENT-001: a step() inside a running step() --------------------------------------------------------------


@dataclass
class _Reentry:
    """Calls whose closure runs its backward, then calls ``step()`` again: the inner call is refused [REENT-001]."""

    model: Halves
    halves: Mapping[str, torch.nn.Module]
    wrappers: dict[str, Any]
    closure_for: Callable[[str, int], Callable[[], torch.Tensor]]
    calls: list[str]
    """The names of the closures that ran."""
    on_failure: str

    def attempt(
        self, name: str, target: str, other: str, outer_step: bool | None, inner_step: bool | None, held: int
    ) -> int:
        """Wrapper ``name``'s step whose closure calls ``target``'s step; returns the micro-steps ``name`` holds now."""
        wrappers = self.wrappers
        refused: list[BaseException] = []

        def reentering() -> torch.Tensor:
            loss = self.closure_for(name, 1)()
            try:
                wrappers[target].step(self.closure_for(target, 1), make_optimizer_step=inner_step)
            except RuntimeError as error:
                refused.append(error)
                raise
            return loss

        before, others = snapshot(self.model), snapshot(self.halves[other])
        outcomes = {key: wrapper.last_outcome for key, wrapper in wrappers.items()}
        self.calls.clear()
        what = (
            f"wrapper {name}'s step(make_optimizer_step={outer_step}) whose closure called wrapper "
            f"{target}'s step(make_optimizer_step={inner_step}) (on_failure={self.on_failure!r})"
        )
        with refuses(
            RuntimeError,
            what,
            "REENT-001: a step() called while a step() of the same context runs is refused with "
            "RuntimeError, and the outer call fails with it",
        ) as raised:
            wrappers[name].step(reentering, make_optimizer_step=outer_step)
        assert len(refused) == 1, f"{what}: the inner step() was not refused with RuntimeError"
        assert raised.value is refused[0], (
            f"{what}: the outer call raised {raised.value!r}, not the inner call's {refused[0]!r}"
        )
        assert self.calls == [name], f"{what}: the closures that ran are {self.calls}, only {name}'s may"
        assert_unchanged(snapshot(self.halves[other]), others, f"{what}, wrapper {other}'s window")
        now = {key: wrapper.last_outcome for key, wrapper in wrappers.items()}
        if self.on_failure != "discard":
            assert_unchanged(snapshot(self.model), before, what)
            assert now == outcomes, f"{what} changed the outcomes from {outcomes} to {now}"
            return held
        whole = snapshot(self.model)
        assert_same_values(whole.values, before.values, what)
        assert whole.flags == before.flags, f"{what}: flags not restored"
        discarded = snapshot(self.halves[name]).grads
        assert_same_grads(
            discarded,
            [None] * len(discarded),
            f"{what}: wrapper {name}'s window was written by the outer closure, so it is discarded (FAIL-003)",
        )
        assert now == outcomes | {name: D}, f"{what}: the outcomes are {now}, expected {name} DISCARDED"
        assert_discard_note(raised.value, wrappers[name].optimizer, (held, held + 1), what)
        return 0


def _sgd_and_adam_oracle(oracle: Halves, window: Sequence[Batch], cell: Cell) -> None:
    """Half ``a`` (SGD with momentum) and half ``b`` (Adam) one step each on their mean over ``window``; one update."""
    scaler = plain_scaler(cell)
    optimizers = {
        "a": torch.optim.SGD(oracle.a.parameters(), lr=SGD_LR, momentum=0.9),
        "b": torch.optim.Adam(oracle.b.parameters(), lr=ADAM_LR),
    }
    for name, half in (("a", oracle.a), ("b", oracle.b)):
        for batch in window:
            scaled_backward(oracle_loss(half, batch, cell), scaler)
        real_step(optimizers[name], len(window), scaler)
    update_scaler(scaler)
    oracle_step_done(cell)


def _sgd_and_adam_halves(
    make_context: MakeContext, cell: Cell, on_failure: str
) -> tuple[TrainingContext, Halves, Halves, dict[str, Any]]:
    """A context (windows of three), ``Halves(51, 52)`` prepared, its oracle copy, and the wrappers of the halves.

    Wrapper ``"a"``: SGD with momentum on half ``a``; wrapper ``"b"``: Adam on half ``b``.
    """
    context = make_context(accumulate_grad_batches=3, **failure_settings(on_failure))
    base = Halves(51, 52)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    wrappers: dict[str, Any] = {
        "a": context.wrap(torch.optim.SGD(model.a.parameters(), lr=SGD_LR, momentum=0.9)),
        "b": context.wrap(torch.optim.Adam(model.b.parameters(), lr=ADAM_LR)),
    }
    return context, model, oracle, wrappers


@pytest.mark.requirement("REENT-001", "CLOS-003", "STEP-004", "FAIL-002", "FAIL-003", "FAIL-004")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("reentered", ["same", "other"])
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    wrappers=("2",),
    window=("k >= 2 micro-steps",),
    make_optimizer_step=("True", "False", "None"),
    faults=("raising closure after its backward", "re-entered step"),
    optimizer=("SGD momentum", "Adam"),
    outcome_read=("after every call of every wrapper",),
    position=("inside batch()",),
    on_failure=("discard", "restore"),
)
def test_step_inside_a_running_step_is_refused(
    make_context: MakeContext, cell: Cell, reentered: str, on_failure: str
) -> None:
    """A ``step()`` from inside a closure, of the same wrapper or the other, raises ``RuntimeError``, changing nothing.

    The refused call's closure never runs, and the outer call (whose closure ran its backward first) fails as a
    raising closure does: the same exception propagates, parameters and flags are as before, and the other
    wrapper's window and outcome are untouched (FAIL-002). Under ``"restore"`` the outer window is as before too;
    under ``"discard"`` it is gone (every gradient ``None``, ``DISCARDED``, a note on the exception). Both windows then
    close on time and match a plain loop over the windows each policy leaves.
    """
    discard = on_failure == "discard"
    context, model, oracle, wrappers = _sgd_and_adam_halves(make_context, cell, on_failure)
    halves = {"a": model.a, "b": model.b}
    batches = make_batches(3, seed=13)
    device, dtype = cell_device(cell), cell_dtype(cell)
    calls: list[str] = []

    def closure_for(name: str, batch_idx: int) -> Callable[[], torch.Tensor]:
        def closure() -> torch.Tensor:
            calls.append(name)
            with context.autocast():
                loss = mse(halves[name], batches[batch_idx], device, dtype) * LOSS_FACTOR
            wrappers[name].backward(loss)
            return loss

        return closure

    with context.batch(0):
        for name in halves:
            wrappers[name].step(closure_for(name, 0))
    with context.batch(1):
        for name in halves:
            target = name if reentered == "same" else ("b" if name == "a" else "a")
            other = "b" if name == "a" else "a"
            reentry = _Reentry(model, halves, wrappers, closure_for, calls, on_failure)
            held = 1
            for outer_step in (False, None, True):
                for inner_step in (None, True, False):
                    held = reentry.attempt(name, target, other, outer_step, inner_step, held)
        for name in halves:
            wrappers[name].step(closure_for(name, 1))
            assert wrappers[name].last_outcome is A, (
                f"wrapper {name}'s second micro-step: {wrappers[name].last_outcome}"
            )
    with context.batch(2):
        for name in halves:
            wrappers[name].step(closure_for(name, 2))
            assert wrappers[name].last_outcome is S, (
                f"after refused re-entered calls, wrapper {name}'s window did not close on time: "
                f"{wrappers[name].last_outcome}"
            )

    # Under "discard" batch 0 is gone with the discarded window.
    _sgd_and_adam_oracle(oracle, batches[1:] if discard else batches, cell)
    assert_params_close(model, oracle, cell, f"two windows that closed after refused re-entered steps ({on_failure})")


# -- ERR-009: flags that are not bool -------------------------------------------------------------------------

_NOT_BOOL: list[object] = [1, 0, "yes", None, torch.tensor(True)]


@pytest.mark.requirement("ERR-009", "TOGGLE-002")
@pytest.mark.parametrize("value", _NOT_BOOL, ids=["1", "0", "yes", "None", "tensor"])
@pytest.mark.varies(
    faults=("invalid argument",),
    wrappers=("2",),
    window=("k >= 2 micro-steps",),
    position=("inside batch()",),
    call_form=("toggle_model block, then step()",),
)
def test_non_bool_sync_grad_and_is_last(make_context: MakeContext, cell: Cell, value: object) -> None:
    """``toggle_model(sync_grad=...)`` and ``batch(is_last=...)`` refuse a non-bool with ``TypeError``; nothing changes.

    The block never runs, no ``requires_grad`` flag changes, the open window stays as it was and closes on time in
    the next valid ``batch()`` (which a refused one must not have left entered).
    """
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(Halves(51, 52))
    assert isinstance(model, Halves)
    wrapper = context.wrap(torch.optim.SGD(model.a.parameters(), lr=SGD_LR))
    other = context.wrap(torch.optim.SGD(model.b.parameters(), lr=SGD_LR))
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(2, seed=14)

    def closure_for(batch: Batch) -> Callable[[], None]:
        def closure() -> None:
            with context.autocast():
                loss = mse(model.a, batch, device, dtype) * LOSS_FACTOR
            wrapper.backward(loss)

        return closure

    with context.batch(0):
        wrapper.step(closure_for(batches[0]))
    assert wrapper.last_outcome is A, f"the first micro-step of a window of two: {wrapper.last_outcome}"
    before = snapshot(model)
    ran: list[str] = []
    for owner in (wrapper, other):
        # Raised by the call or on entering the block: either way the block must not run.
        with (
            refuses(
                TypeError,
                f"{'the first' if owner is wrapper else 'the second'} wrapper's toggle_model(sync_grad={value!r})",
                "ERR-009: a sync_grad that is not a bool is refused with TypeError before anything changes",
            ),
            owner.toggle_model(sync_grad=value),  # type: ignore[arg-type]
        ):
            ran.append("toggle_model")
    with (
        refuses(
            TypeError,
            f"context.batch(1, is_last={value!r})",
            "ERR-009: an is_last that is not a bool is refused with TypeError before anything changes",
        ),
        context.batch(1, is_last=value),  # type: ignore[arg-type]
    ):
        ran.append("batch")
    assert ran == [], f"the blocks of {ran} ran with a flag of {value!r}"
    assert_unchanged(snapshot(model), before, f"refused toggle_model(sync_grad={value!r}) and batch(is_last=...)")
    assert wrapper.last_outcome is A and other.last_outcome is None, "a refused block changed an outcome"
    with context.batch(1, is_last=True):
        with wrapper.toggle_model(sync_grad=True):
            closure_for(batches[1])()
        wrapper.step()
    assert wrapper.last_outcome is S, f"after refused flags, the window did not close on time: {wrapper.last_outcome}"


# -- ERR-010: an optimizer another live context wraps ---------------------------------------------------------


@pytest.mark.requirement("ERR-010", "TOGGLE-001")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(faults=("invalid argument",), wrappers=("1", "2"), modules=("1 prepared module",))
def test_wrap_of_an_optimizer_another_context_wraps(make_context: MakeContext, cell: Cell) -> None:
    """``wrap`` refuses, with ``ValueError``, an optimizer that another live context wraps; it changes nothing.

    The first context's wrapper still steps; the second context has not taken the optimizer (its own wrapper's
    closure leaves the refused optimizer's parameters alone); once the first context is gone, a new one may wrap it.
    """
    first = make_context()
    model = first.prepare_module(make_model())
    inner = torch.optim.SGD(model.parameters(), lr=0.1)
    wrapper = first.wrap(inner)
    second = make_context()
    with refuses(
        ValueError,
        "second.wrap(optimizer) of an optimizer that a first, live context wraps",
        "ERR-010: wrap of an optimizer that another live training context already wraps is refused",
    ):
        second.wrap(inner)
    other_model = second.prepare_module(make_model(seed=3))
    mine = second.wrap(torch.optim.SGD(other_model.parameters(), lr=0.1))
    flags: list[bool] = []
    device, dtype = cell_device(cell), cell_dtype(cell)
    batch = make_batches(1)[0]

    def closure() -> None:
        flags.extend(p.requires_grad for p in model.parameters())
        with second.autocast():
            loss = mse(other_model, batch, device, dtype) * LOSS_FACTOR
        mine.backward(loss)

    mine.step(closure, make_optimizer_step=True)
    assert mine.last_outcome is S, f"the second context's own wrapper: {mine.last_outcome}"
    assert all(flags), "the second context toggled the refused optimizer's parameters off: it took the optimizer"
    outcomes = run_steps(first, model, wrapper, make_batches(1), cell, lambda i: True)
    assert outcomes == [S], f"after a refused wrap elsewhere, the first context's wrapper stepped as {outcomes}"
    del wrapper, first
    gc.collect()
    third = make_context()
    try:
        again = third.wrap(inner)  # the first context is gone: nothing wraps the optimizer any more
    except ValueError as error:
        gone = "once its first context was gone, wrapping the optimizer again was refused"
        raise AssertionError(f"{gone}: {error}") from None
    outcomes = run_steps(third, model, again, make_batches(1), cell, lambda i: True)
    assert outcomes == [S], f"the optimizer wrapped again after its first context was gone stepped as {outcomes}"


# -- CTX-002: gradient_clip_val -------------------------------------------------------------------------------


@pytest.mark.requirement("CTX-002")
@pytest.mark.parametrize(
    "value", [math.nan, math.inf, -math.inf, 0, 0.0, -0.5], ids=["nan", "inf", "-inf", "0", "0.0", "-0.5"]
)
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.varies(faults=("invalid argument",), clipping=("norm", "value"))
def test_invalid_gradient_clip_val(make_context: MakeContext, cell: Cell, value: float, algorithm: str) -> None:
    """``gradient_clip_val`` of ``nan``, ``inf``, zero or less is refused with ``ValueError`` at construction."""
    with refuses(
        ValueError,
        f"factory(cell, gradient_clip_val={value!r}, gradient_clip_algorithm={algorithm!r})",
        "CTX-002: gradient_clip_val is None or a finite positive number, anything else is refused at construction",
    ):
        make_context(gradient_clip_val=value, gradient_clip_algorithm=algorithm)
    for fine in (1, 0.5, 1e-6):
        make_context(gradient_clip_val=fine, gradient_clip_algorithm=algorithm)


# -- CKPT-004: a state or copy taken inside batch() after a real step -----------------------------------------

_PENDING_BATCHES = make_batches(4, seed=15)
_OVERFLOW = 1
"""Under 16-mixed, the batch in which optimizer A's loss is infinite (A skips its step, the scale backs off)."""
_PENDING_SCALES = [2.0**10] * 2 + [2.0**11] * 2 + [2.0**10] * 2 + [2.0**11] * 2
"""Under 16-mixed, the scale of each backward pass (A's, then B's, per batch), worked by hand from ``GROWING``: one
update per iteration over both optimizers; batch 0 grows, batch 1 backs off (A overflowed), batch 2 grows."""
_TAKEN = {
    "overflow-then-B": (1, 1),
    "overflow-and-B": (1, 2),
    "finite-and-B": (2, 2),
}
"""Where the state or copy is taken: (batch, how many of A's and B's steps of that batch ran before)."""


def _pair(make_context: MakeContext, cell: Cell) -> tuple[TrainingContext, torch.nn.Module, list[Any]]:
    """A fresh context (one micro-step per window) with A (SGD momentum, the first layer) and B (Adam, the last)."""
    context = make_context(**scaler_settings(cell, GROWING))
    model = context.prepare_module(make_model())
    first_weight, first_bias, last_weight, last_bias = model.parameters()
    opt_a = context.wrap(torch.optim.SGD([first_weight, first_bias], lr=0.5, momentum=0.9))
    opt_b = context.wrap(torch.optim.Adam([last_weight, last_bias], lr=ADAM_LR))
    return context, model, [opt_a, opt_b]


def _pair_step(
    context: TrainingContext, model: torch.nn.Module, wrappers: list[Any], batch_idx: int, which: int, cell: Cell
) -> list[float]:
    """Optimizer ``which``'s step in batch ``batch_idx``; under 16-mixed, the scale its backward pass used."""
    scales: list[float] = []
    wrapper = wrappers[which]

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, _PENDING_BATCHES[batch_idx], cell_device(cell), cell_dtype(cell)) * LOSS_FACTOR
        if cell.precision == "16-mixed":
            if which == 0 and batch_idx == _OVERFLOW:
                loss = loss * math.inf
            loss.register_hook(lambda grad: scales.append(float(grad)))
        wrapper.backward(loss)
        return loss

    wrapper.step(closure)
    return scales


def _pair_batches(
    context: TrainingContext, model: torch.nn.Module, wrappers: list[Any], cell: Cell, start: tuple[int, int]
) -> list[float]:
    """Train from step ``start[1]`` of batch ``start[0]`` to the end of the epoch; the scales used."""
    scales: list[float] = []
    for batch_idx in range(start[0], len(_PENDING_BATCHES)):
        with context.batch(batch_idx, is_last=batch_idx == len(_PENDING_BATCHES) - 1):
            for which in range(start[1] if batch_idx == start[0] else 0, 2):
                scales += _pair_step(context, model, wrappers, batch_idx, which, cell)
    return scales


def _pair_oracle(cell: Cell) -> tuple[torch.nn.Module, list[float]]:
    """The plain loop: A then B each batch, one ``GradScaler`` updated once per iteration over both optimizers."""
    model = oracle_copy(make_model(), cell)
    first_weight, first_bias, last_weight, last_bias = model.parameters()
    optimizers: list[torch.optim.Optimizer] = [
        torch.optim.SGD([first_weight, first_bias], lr=0.5, momentum=0.9),
        torch.optim.Adam([last_weight, last_bias], lr=ADAM_LR),
    ]
    scaler = plain_scaler(cell, GROWING)
    scales: list[float] = []
    for batch_idx, batch in enumerate(_PENDING_BATCHES):
        for which, optimizer in enumerate(optimizers):
            model.zero_grad(set_to_none=True)  # the other optimizer's parameters get no gradient (toggled)
            if scaler is not None:
                scales.append(scaler.get_scale())
            blow_up = scaler is not None and which == 0 and batch_idx == _OVERFLOW
            scaled_backward(oracle_loss(model, batch, cell, blow_up), scaler)
            real_step(optimizer, 1, scaler)
        update_scaler(scaler)
        oracle_step_done(cell)
    return model, scales


def _assert_pair_run(
    model: torch.nn.Module, scales: list[float], cell: Cell, what: str, oracle: tuple[torch.nn.Module, list[float]]
) -> None:
    oracle_model, want = oracle
    if cell.precision == "16-mixed":
        assert want == _PENDING_SCALES, f"the plain GradScaler loop scaled by {want}, by hand {_PENDING_SCALES}"
        assert scales == want, (
            f"{what}: the backward passes were scaled by {scales}; a plain GradScaler updated once per iteration over "
            f"both optimizers scales them by {want}: the iteration's pending update was lost or applied twice"
        )
    assert_params_close(model, oracle_model, cell, what)


@pytest.mark.requirement("CKPT-004", "CKPT-002", "AMP-003")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("taken", list(_TAKEN))
@pytest.mark.varies(
    copies=("checkpoint",),
    wrappers=("2",),
    window=("1 micro-step",),
    position=("inside batch()",),
    loss_scale=("backed off", "grown", "settings given to the factory"),
    optimizer=("SGD momentum", "Adam"),
)
def test_checkpoint_inside_batch_carries_the_pending_update(make_context: MakeContext, cell: Cell, taken: str) -> None:
    """A state taken inside ``batch()`` after a real step, loaded into fresh objects inside the resumed ``batch()``.

    The resumed context applies the iteration's pending loss-scaler update (A's overflow or A's finite step) at the
    block's end, with those of the steps it takes before: every scale is the plain loop's, and so are the parameters
    of the resumed run and of the original, which goes on after the state was taken.
    """
    start = _TAKEN[taken]
    oracle_model, want_scales = _pair_oracle(cell)
    context, model, wrappers = _pair(make_context, cell)
    scales: list[float] = []
    buffer = io.BytesIO()
    for batch_idx in range(start[0]):
        with context.batch(batch_idx):
            for which in range(2):
                scales += _pair_step(context, model, wrappers, batch_idx, which, cell)
    with context.batch(start[0]):
        for which in range(start[1]):
            scales += _pair_step(context, model, wrappers, start[0], which, cell)
        state = {
            "model": model.state_dict(),
            "optimizers": [wrapper.state_dict() for wrapper in wrappers],
            "context": context.state_dict(),
        }
        torch.save(state, buffer)
        for which in range(start[1], 2):
            scales += _pair_step(context, model, wrappers, start[0], which, cell)
    original = scales + _pair_batches(context, model, wrappers, cell, (start[0] + 1, 0))
    _assert_pair_run(
        model, original, cell, f"the original, after a state was taken ({taken})", (oracle_model, want_scales)
    )

    resumed_context, resumed_model, resumed_wrappers = _pair(make_context, cell)
    saved = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    resumed_model.load_state_dict(saved["model"])
    for wrapper, optimizer_state in zip(resumed_wrappers, saved["optimizers"], strict=True):
        wrapper.load_state_dict(optimizer_state)
    resumed = scales[: 2 * start[0] + start[1]]
    with resumed_context.batch(start[0], is_last=start[0] == len(_PENDING_BATCHES) - 1):
        resumed_context.load_state_dict(saved["context"])
        for which in range(start[1], 2):
            resumed += _pair_step(resumed_context, resumed_model, resumed_wrappers, start[0], which, cell)
    resumed += _pair_batches(resumed_context, resumed_model, resumed_wrappers, cell, (start[0] + 1, 0))
    _assert_pair_run(
        resumed_model,
        resumed,
        cell,
        f"resumed from a state taken inside batch() ({taken})",
        (oracle_model, want_scales),
    )


@pytest.mark.requirement("CKPT-004", "PICKLE-001", "AMP-003")
@pytest.mark.features("pickling")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("taken", list(_TAKEN))
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.varies(
    copies=("pickle", "deepcopy"),
    wrappers=("2",),
    window=("1 micro-step",),
    position=("inside batch()",),
    loss_scale=("backed off", "grown", "settings given to the factory"),
    optimizer=("SGD momentum", "Adam"),
)
def test_copy_inside_batch_carries_the_pending_update(
    make_context: MakeContext, cell: Cell, taken: str, how: str
) -> None:
    """A copy of the whole training state taken inside ``batch()`` after a real step continues in a ``batch()``.

    The copy (context, model and wrappers together) applies the pending update when its resumed block ends; the
    original, which finishes its own block, is unaffected: both follow the plain loop's scales and parameters.
    """
    start = _TAKEN[taken]
    oracle_model, want_scales = _pair_oracle(cell)
    context, model, wrappers = _pair(make_context, cell)
    scales: list[float] = []
    for batch_idx in range(start[0]):
        with context.batch(batch_idx):
            for which in range(2):
                scales += _pair_step(context, model, wrappers, batch_idx, which, cell)
    with context.batch(start[0]):
        for which in range(start[1]):
            scales += _pair_step(context, model, wrappers, start[0], which, cell)
        whole = (context, model, wrappers)
        clone = pickle.loads(pickle.dumps(whole)) if how == "pickle" else copy.deepcopy(whole)
        for which in range(start[1], 2):
            scales += _pair_step(context, model, wrappers, start[0], which, cell)
    copied = list(scales[: 2 * start[0] + start[1]])
    original = scales + _pair_batches(context, model, wrappers, cell, (start[0] + 1, 0))
    _assert_pair_run(
        model, original, cell, f"the original, after a {how} was taken ({taken})", (oracle_model, want_scales)
    )

    clone_context, clone_model, clone_wrappers = clone
    assert clone_model is not model, f"the {how} shares the model"
    copied += _pair_batches(clone_context, clone_model, clone_wrappers, cell, start)
    _assert_pair_run(
        clone_model, copied, cell, f"a {how} taken inside batch() ({taken}), continued", (oracle_model, want_scales)
    )


def _halves_pair(
    make_context: MakeContext, cell: Cell, on_failure: str = "discard"
) -> tuple[TrainingContext, Halves, Halves, dict[str, Any], dict[str, Callable[[int], torch.Tensor]]]:
    """Two halves with a window of two micro-steps each, and each half's loss of batch ``i``."""
    context = make_context(accumulate_grad_batches=2, **failure_settings(on_failure))
    base = Halves(51, 52)
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    assert isinstance(model, Halves) and isinstance(oracle, Halves)
    wrappers: dict[str, Any] = {
        "a": context.wrap(torch.optim.SGD(model.a.parameters(), lr=SGD_LR)),
        "b": context.wrap(torch.optim.SGD(model.b.parameters(), lr=SGD_LR)),
    }
    batches = make_batches(2, seed=16)
    device, dtype = cell_device(cell), cell_dtype(cell)

    def loss_for(half: torch.nn.Module) -> Callable[[int], torch.Tensor]:
        def loss(batch_idx: int) -> torch.Tensor:
            with context.autocast():
                return mse(half, batches[batch_idx], device, dtype) * LOSS_FACTOR

        return loss

    losses = {"a": loss_for(model.a), "b": loss_for(model.b)}
    return context, model, oracle, wrappers, losses


def _halves_oracle(cell: Cell, oracle: Halves, a_window: Sequence[int] = (0, 1)) -> None:
    """Each half one SGD step on the mean of its micro-batches (b's two, a's ``a_window``); one scaler, updated once."""
    batches = make_batches(2, seed=16)
    oracle_mean_steps([oracle.a, oracle.b], batches, cell, SGD_LR, LOSS_FACTOR, windows=[a_window, (0, 1)])


def _assert_discarded(
    model: Halves, before: Snapshot, wrapper: Any, error: BaseException, held: int, what: str
) -> None:
    """Half ``a``'s window is discarded [FAIL-003]; parameters, flags and half ``b``'s window as before [FAIL-002]."""
    now = snapshot(model)
    assert_same_values(now.values, before.values, what)
    assert now.flags == before.flags, f"{what} changed requires_grad flags"
    count = len(list(model.a.parameters()))
    want = [None] * count + before.grads[count:]
    assert_same_grads(now.grads, want, f"{what} (wrapper a's window discarded, b's untouched)")
    assert wrapper.last_outcome is D, f"{what}: wrapper a's last_outcome is {wrapper.last_outcome}, not DISCARDED"
    assert_discard_note(error, wrapper.optimizer, (held, held + 1), what)


def _states_and_copies(
    context: TrainingContext, wrapper_b: Any, pickling: bool
) -> tuple[dict[str, Callable[[], object]], dict[str, str]]:
    """What takes a state or a copy, by name, and the call each name stands for.

    ``state_dict()`` always; with ``pickling`` a deepcopy of the context and a pickle of wrapper b too.
    """
    takes: dict[str, Callable[[], object]] = {"state_dict()": context.state_dict}
    if pickling:
        takes |= {
            "copy.deepcopy(context)": lambda: copy.deepcopy(context),
            "pickle.dumps(wrapper b)": lambda: pickle.dumps(wrapper_b),
        }
    calls_of = {what: "context.state_dict()" if what == "state_dict()" else what for what in takes}
    return takes, calls_of


def _assert_refused_after_unscale_gradients(
    model: Halves, takes: Mapping[str, Callable[[], object]], calls_of: Mapping[str, str]
) -> None:
    """Every state or copy taken after wrapper a's ``unscale_gradients()`` is refused and changes nothing [CKPT-004]."""
    before = snapshot(model)
    for what, take in takes.items():
        with refuses(
            RuntimeError,
            f"{calls_of[what]} after wrapper a's unscale_gradients(), before its closing step()",
            "CKPT-004: a state or copy taken after unscale_gradients(), before the closing step(), is refused",
        ):
            take()
        assert_unchanged(snapshot(model), before, f"{what} after unscale_gradients()")


@pytest.mark.requirement("CKPT-004", "CLOS-003", "FAIL-003", "FAIL-004")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    copies=("checkpoint", "pickle", "deepcopy"),
    faults=("raising closure after its backward",),
    clipping=("unscale_gradients() by hand",),
    wrappers=("2",),
    window=("k >= 2 micro-steps",),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    position=("inside batch()",),
    on_failure=("discard", "restore"),
)
def test_state_or_copy_mid_step_is_refused(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any], on_failure: str
) -> None:
    """``state_dict()`` or a copy while a ``step()`` runs, or after ``unscale_gradients()``, raises ``RuntimeError``.

    From a closure (after its backward), the refusal fails the call as a raising closure does: both windows as
    before under ``"restore"``; under ``"discard"`` the calling wrapper's window is gone and the other's untouched.
    After ``unscale_gradients()``, the prepared window is unchanged and its closing step applies it. Both windows
    then close as a plain loop's; the state can be taken again once the step has run.
    """
    discard = on_failure == "discard"
    context, model, oracle, wrappers, losses = _halves_pair(make_context, cell, on_failure)
    takes, calls_of = _states_and_copies(context, wrappers["b"], "pickling" in implementation.features)
    with context.batch(0):
        for name in ("a", "b"):
            wrappers[name].step(lambda name=name: wrappers[name].backward(losses[name](0)))
    held = 1
    with context.batch(1):
        for what, take in takes.items():
            for make_step in (False, True):

                def closure(take: Callable[[], object] = take) -> None:
                    wrappers["a"].backward(losses["a"](1))
                    take()

                before = snapshot(model)
                call = (
                    f"wrapper a's step(closure, make_optimizer_step={make_step}) whose closure calls {calls_of[what]}"
                )
                with refuses(
                    RuntimeError,
                    call,
                    "CKPT-004: a state or copy taken while a step() runs is refused with RuntimeError",
                ) as raised:
                    wrappers["a"].step(closure, make_optimizer_step=make_step)
                if discard:
                    _assert_discarded(model, before, wrappers["a"], raised.value, held, call)
                    held = 0
                    continue
                assert_unchanged(
                    snapshot(model), before, f"{what} inside the closure of step(make_optimizer_step={make_step})"
                )
                assert wrappers["a"].last_outcome is A, f"a refused {what} changed the outcome"
        wrappers["a"].backward(losses["a"](1))
        wrappers["a"].unscale_gradients()
        _assert_refused_after_unscale_gradients(model, takes, calls_of)
        wrappers["a"].step(make_optimizer_step=True)
        assert wrappers["a"].last_outcome is S, f"the prepared window's closing step: {wrappers['a'].last_outcome}"
        for take in takes.values():
            take()  # between calls, inside batch() after a real step: allowed
        wrappers["b"].step(lambda: wrappers["b"].backward(losses["b"](1)))
        assert wrappers["b"].last_outcome is S, f"wrapper b's window: {wrappers['b'].last_outcome}"
    _halves_oracle(cell, oracle, (1,) if discard else (0, 1))
    assert_params_close(model, oracle, cell, f"two windows closed after refused states and copies ({on_failure})")


# -- CLIP-002: backward() after unscale_gradients() -----------------------------------------------------------


@pytest.mark.requirement("CLIP-002", "CLOS-003", "FAIL-003", "FAIL-004")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    clipping=("unscale_gradients() by hand",),
    wrappers=("2",),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    call_form=("backward, then step()", "closure, wrapper.backward"),
    faults=("raising closure after its backward", "failing closing step of a prepared window"),
    position=("inside batch()",),
    on_failure=("discard", "restore"),
)
def test_backward_after_unscale_gradients_is_refused(make_context: MakeContext, cell: Cell, on_failure: str) -> None:
    """After ``unscale_gradients()``, a ``backward()`` of either wrapper raises ``RuntimeError`` and changes nothing.

    Between the calls, and inside the closure of the closing step, which then fails as a raising closure does: under
    ``"restore"`` the window is as before the call (not prepared), so that its retry prepares it once; under
    ``"discard"`` the window the closure prepared is gone, and the loss scaler has forgotten its unscaling, so that
    a new window in the same iteration is prepared (unscaled) once again. Both windows then close as a plain loop's.
    """
    discard = on_failure == "discard"
    context, model, oracle, wrappers, losses = _halves_pair(make_context, cell, on_failure)
    with context.batch(0):
        for name in ("a", "b"):
            wrappers[name].step(lambda name=name: wrappers[name].backward(losses[name](0)))
    with context.batch(1):
        before = snapshot(model)

        def closure() -> None:
            wrappers["a"].backward(losses["a"](1))
            wrappers["a"].unscale_gradients()
            wrappers["a"].backward(losses["a"](1))

        call = (
            "wrapper a's step(closure, make_optimizer_step=True) whose closure calls backward() after "
            "unscale_gradients()"
        )
        with refuses(
            RuntimeError,
            call,
            "CLIP-002: a backward() after unscale_gradients() adds scaled gradients to prepared ones, so it is "
            "refused until the closing step()",
        ) as raised:
            wrappers["a"].step(closure, make_optimizer_step=True)
        if discard:
            _assert_discarded(model, before, wrappers["a"], raised.value, 1, call)
        else:
            assert_unchanged(snapshot(model), before, "a closing step whose closure ran backward() after unscaling")
            assert wrappers["a"].last_outcome is A, (
                f"the refused backward changed the outcome: {wrappers['a'].last_outcome}"
            )
        wrappers["a"].backward(losses["a"](1))
        wrappers["a"].unscale_gradients()
        before = snapshot(model)
        for name in ("a", "b"):
            with refuses(
                RuntimeError,
                f"wrapper {name}'s backward(loss) after wrapper a's unscale_gradients(), before a's closing step()",
                "CLIP-002: a backward() of any wrapper of the context is refused between unscale_gradients() and "
                "the closing step()",
            ):
                wrappers[name].backward(losses[name](1))
            assert_unchanged(snapshot(model), before, f"wrapper {name}'s backward() after a's unscale_gradients()")
        wrappers["a"].step(make_optimizer_step=True)
        assert wrappers["a"].last_outcome is S, f"the prepared window's closing step: {wrappers['a'].last_outcome}"
        wrappers["b"].backward(losses["b"](1))  # the closing step has run: backward is allowed again
        wrappers["b"].step()
        assert wrappers["b"].last_outcome is S, f"wrapper b's window: {wrappers['b'].last_outcome}"
    _halves_oracle(cell, oracle, (1,) if discard else (0, 1))
    assert_params_close(model, oracle, cell, f"two windows closed after refused backward() calls ({on_failure})")
