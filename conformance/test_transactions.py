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
import itertools
import math
import pickle
from collections.abc import Callable
from functools import partial
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_unchanged, snapshot
from lightning_optimizer.conformance.checkpointing import layer_optimizers, run_plan, through_a_checkpoint
from lightning_optimizer.conformance.data_parallel import plain_epoch
from lightning_optimizer.conformance.failure_rigs import (
    EAGER,
    GROWING,
    SGD_LR,
    FailurePlan,
    Rig,
    run_epoch,
)
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    ON_FAILURE,
    assert_params_close,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    make_model,
    mse,
    refuses,
    run_steps,
    scaler_settings,
)
from lightning_optimizer.conformance.oracles import expected_outcomes, oracle_copy, oracle_mean_steps
from lightning_optimizer.conformance.plain_loop import (
    plain_scaler,
)
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, D = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.DISCARDED
ERR_008 = "ERR-008: keywords that the inner step() cannot take are refused with TypeError before anything runs"


# -- ERR-008: keyword arguments the inner step cannot take ---------------------------------------------------


class _KeywordSGD(torch.optim.SGD):
    """An SGD whose ``step`` takes one keyword argument of its own, and records what it received."""

    received: list[float]

    def step(self, closure: Any = None, *, lr_factor: float = 1.0) -> Any:
        self.received.append(lr_factor)
        for group in self.param_groups:
            group["lr"] = SGD_LR * lr_factor
        return super().step(closure)


def _refused_with_a_window_open(rig: Rig) -> None:
    """Keywords the inner step (``lr_factor`` only) cannot take, on calls that accumulate or step: all refused."""
    wrapper, why = rig.wrappers["a"], f"{ERR_008}, on a call that only accumulates too"
    bad: list[dict[str, Any]] = [{"lr_facter": 2.0}, {"lr_factor": 2.0, "nesterov": True}, {"set_to_none": True}]
    for make_step, kwargs in itertools.product((False, None, True), bad):
        given = ", ".join(f"{key}={value!r}" for key, value in kwargs.items())
        for closure in ([rig.closure("a", 1)], []):
            call = (
                f"wrapper.step({'closure, ' * len(closure)}make_optimizer_step={make_step}, {given}) with a window "
                "open (the inner step() takes lr_factor only)"
            )
            rig.fails(
                call, why, partial(wrapper.step, *closure, make_optimizer_step=make_step, **kwargs), raised=TypeError
            )
            assert rig.ran == [], f"{call} ran the closure"
            assert wrapper.optimizer.received == [], f"{call} reached the inner step"


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
    batches = make_batches(2, seed=11)
    adam = Rig(make_context, cell, batches, ("Adam",), seeds=(0, 1))
    for make_step in (True, None, False):
        call = (
            f"adam.step(closure, make_optimizer_step={make_step}, lr_factor=2.0) on an empty window (Adam's step() "
            "takes no lr_factor)"
        )
        closure = adam.closure("a", 0)
        adam.fails(call, ERR_008, partial(adam.wrappers["a"].step, closure, make_step, lr_factor=2.0), raised=TypeError)
        assert adam.ran == [], f"step(lr_factor=2.0, make_optimizer_step={make_step}) on Adam ran the closure"
        assert not adam.inner["a"].state, "a refused step() made Adam create its state"
    # An open window of two micro-steps: SGD with a keyword of its own.
    keyword = (_KeywordSGD, torch.optim.SGD, {"lr": SGD_LR})
    rig = Rig(make_context, cell, batches, (keyword,), seeds=(0, 1), accumulate_grad_batches=2)
    wrapper, inner = rig.wrappers["a"], rig.inner["a"]
    assert isinstance(inner, _KeywordSGD)
    inner.received = []
    with rig.context.batch(0):
        wrapper.step(rig.closure("a", 0), lr_factor=3.0)  # accumulates: the keyword is fine
    assert wrapper.last_outcome is A, f"the first micro-step of a window of two: {wrapper.last_outcome}"
    assert inner.received == [], f"an accumulating call reached the inner step with {inner.received}"
    rig.ran.clear()
    with rig.context.batch(1):
        _refused_with_a_window_open(rig)
        # The backward-then-step form: the refused step leaves the backward's gradients in the window.
        wrapper.backward(rig.loss("a", 1))
        call = (
            "wrapper.step(make_optimizer_step=None, lr_facter=2.0) after the window's last backward (the inner "
            "step() takes lr_factor only)"
        )
        rig.fails(call, ERR_008, partial(wrapper.step, make_optimizer_step=None, lr_facter=2.0), raised=TypeError)
        wrapper.step(make_optimizer_step=None, lr_factor=2.0)
    assert wrapper.last_outcome is S, f"after refused calls, the window did not close on time: {wrapper.last_outcome}"
    assert inner.received == [2.0], f"the inner step received lr_factor {inner.received}, expected [2.0] once"
    oracle_mean_steps([rig.oracle.a], batches, cell, SGD_LR * 2.0, LOSS_FACTOR)
    rig.assert_oracle("a window closed with lr_factor=2.0 after refused keywords")


# -- TXN-001: a real step whose inner step raises ------------------------------------------------------------

_FAILURES = {
    "window-1-closure": (
        FailurePlan(1, "SGD momentum", "closure", "inner", 3, 1, 0, ((0,), (1,), (2,)), (S, S, S)),
        ((0,), (1,), (2,)),
        (S, S, S),
    ),
    "window-3-closure-clipped": (
        FailurePlan(3, "SGD", "closure", "inner", 6, 5, 2, ((0, 1, 2), (3, 4, 5)), (A, A, S, A, A, S), clip=2e-4),
        ((0, 1, 2), (5,)),
        (A, A, S, A, A, S),
    ),
    "cut-short-backward-adam": (
        FailurePlan(
            4, "Adam", "backward", "inner", 7, 5, 1, ((0, 1, 2, 3), (4, 5), (6,)), (A, A, A, S, A, S, S), {5: True}
        ),
        ((0, 1, 2, 3), (5,), (6,)),
        (A, A, A, S, A, S, S),
    ),
    "prepared-backward-clipped": (
        FailurePlan(2, "SGD momentum", "backward", "prepared", 4, 3, 1, ((0, 1), (2, 3)), (A, S, A, S), clip=2e-4),
        ((0, 1), (3,)),
        (A, S, A, S),
    ),
    "retried-in-next-batch": (
        FailurePlan(
            4,
            "SGD momentum",
            "closure",
            "inner",
            4,
            1,
            1,
            ((0, 2), (3,)),
            (A, A, S, S),
            {1: True, 2: True, 3: True},
            retry="skip",
        ),
        ((2,), (3,)),
        (A, D, S, S),
    ),
}
"""Each plan (its windows and outcomes under ``"restore"``: the failed call adds nothing to its window, the retry, a
closing call without a new backward in the backward-then-step form, closes it), and the windows and outcomes under
``"discard"``: the failed window is gone; its retry, with a new backward (and ``unscale_gradients()`` again where the
plan prepares), makes a window of the failing batch alone. By hand; 16-mixed skips none (the losses are small)."""


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
    plan, discard_windows, discard_outcomes = _FAILURES[scenario]
    discard = on_failure == "discard"
    windows, pattern = (discard_windows, discard_outcomes) if discard else (plan.windows, plan.outcomes)
    rig = Rig(
        make_context,
        cell,
        make_batches(plan.batches, seed=12),
        (plan.kind,),
        (0, 1),
        accumulate_grad_batches=plan.accumulate,
        gradient_clip_val=plan.clip,
        **scaler_settings(cell, GROWING),
        **failure_settings(on_failure),
    )
    what = f"a closing step() whose inner optimizer's step raises ({scenario}, on_failure={on_failure!r})"
    outcomes = run_epoch(rig, plan, what, on_failure, "checkpointing" in implementation.features)
    want_scales, stepped = rig.train_oracle({"a": windows})
    want_outcomes = expected_outcomes(pattern, stepped)
    assert outcomes == want_outcomes, f"the calls took {outcomes}, expected {want_outcomes} ({scenario})"
    if cell.precision == "16-mixed":
        got_scales = [scale for batch_idx, scale in rig.scales if any(batch_idx in window for window in windows)]
        assert got_scales == want_scales, (
            f"the backward passes were scaled by {got_scales}; a plain GradScaler over the windows {windows} scales "
            f"them by {want_scales}: the failed step changed the loss scaler"
            + (" (under on_failure='discard' it must forget what it recorded of the failed step)" if discard else "")
        )
    rig.assert_oracle(f"after a failed inner step and its retry, the windows {windows} ({scenario})")


# -- REENT-001: a step() inside a running step() --------------------------------------------------------------


def _reenter(
    rig: Rig, name: str, target: str, outer: bool | None, inner: bool | None, on_failure: str, held: int
) -> int:
    """``name``'s step whose closure runs its backward, then ``target``'s step; the micro-steps ``name`` holds after."""
    refused: list[BaseException] = []

    def reentering() -> None:
        rig.closure(name, 1)()
        try:
            rig.wrappers[target].step(rig.closure(target, 1), make_optimizer_step=inner)
        except RuntimeError as error:
            refused.append(error)
            raise

    what = (
        f"wrapper {name}'s step(make_optimizer_step={outer}) whose closure called wrapper "
        f"{target}'s step(make_optimizer_step={inner}) (on_failure={on_failure!r})"
    )
    why = "REENT-001: a step() called while a step() of the same context runs is refused with RuntimeError"
    rig.ran.clear()
    discarded, failing = name if on_failure == "discard" else None, partial(rig.wrappers[name].step, reentering, outer)
    raised = rig.fails(what, why, failing, raised=RuntimeError, discarded=discarded, held=held)
    assert len(refused) == 1, f"{what}: the inner step() was not refused with RuntimeError"
    assert raised is refused[0], f"{what}: the outer call raised {raised!r}, not the inner call's {refused[0]!r}"
    assert rig.ran == [name], f"{what}: the closures that ran are {rig.ran}, only {name}'s may"
    return held if discarded is None else 0


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
    batches = make_batches(3, seed=13)
    settings = {"accumulate_grad_batches": 3, **failure_settings(on_failure)}
    rig = Rig(make_context, cell, batches, ("SGD momentum", "Adam"), (51, 52), **settings)
    rig.batch(0, "a", "b")
    with rig.context.batch(1):
        for name, other in (("a", "b"), ("b", "a")):
            held = 1
            for outer_step, inner_step in itertools.product((False, None, True), (None, True, False)):
                target = name if reentered == "same" else other
                held = _reenter(rig, name, target, outer_step, inner_step, on_failure, held)
        for name in ("a", "b"):
            rig.call(name, 1)
            outcome = rig.wrappers[name].last_outcome
            assert outcome is A, f"wrapper {name}'s second micro-step: {outcome}"
    with rig.context.batch(2):
        for name in ("a", "b"):
            rig.call(name, 2)
            outcome = rig.wrappers[name].last_outcome
            assert outcome is S, (
                f"after refused re-entered calls, wrapper {name}'s window did not close on time: {outcome}"
            )
    window = (1, 2) if discard else (0, 1, 2)  # under "discard" batch 0 is gone with the discarded windows
    rig.train_oracle({"a": [window], "b": [window]})
    rig.assert_oracle(f"two windows that closed after refused re-entered steps ({on_failure})")


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
    rig = Rig(make_context, cell, make_batches(2, seed=14), seeds=(51, 52), accumulate_grad_batches=2)
    context, wrapper, other = rig.context, rig.wrappers["a"], rig.wrappers["b"]
    with context.batch(0):
        rig.call("a", 0)
    assert wrapper.last_outcome is A, f"the first micro-step of a window of two: {wrapper.last_outcome}"
    before = snapshot(rig.model)
    ran: list[str] = []
    for owner in (wrapper, other):
        # Raised by the call or on entering the block: either way the block must not run.
        with (
            refuses(
                TypeError,
                f"{'the first' if owner is wrapper else 'the second'} wrapper's toggle_model(sync_grad={value!r})",
                "ERR-009: a sync_grad that is not a bool is refused with TypeError before anything changes",
            ),
            owner.toggle_model(sync_grad=value),
        ):
            ran.append("toggle_model")
    with (
        refuses(
            TypeError,
            f"context.batch(1, is_last={value!r})",
            "ERR-009: an is_last that is not a bool is refused with TypeError before anything changes",
        ),
        context.batch(1, is_last=value),
    ):
        ran.append("batch")
    assert ran == [], f"the blocks of {ran} ran with a flag of {value!r}"
    assert_unchanged(rig.model, before, f"refused toggle_model(sync_grad={value!r}) and batch(is_last=...)")
    assert wrapper.last_outcome is A and other.last_outcome is None, "a refused block changed an outcome"
    with context.batch(1, is_last=True):
        with wrapper.toggle_model(sync_grad=True):
            rig.closure("a", 1)()
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


@pytest.mark.requirement("CTX-002")
@pytest.mark.varies(faults=("invalid argument",), clipping=("value",))
def test_clipping_by_value_needs_a_value(make_context: MakeContext, cell: Cell) -> None:
    """``gradient_clip_algorithm="value"`` without ``gradient_clip_val`` is refused at construction.

    It would clip nothing. The default algorithm without a value clips nothing, as no clipping asked for.
    """
    for given in (
        {"gradient_clip_algorithm": "value"},
        {"gradient_clip_algorithm": "value", "gradient_clip_val": None},
    ):
        arguments = ", ".join(f"{key}={value!r}" for key, value in given.items())
        with refuses(
            ValueError,
            f"factory(cell, {arguments})",
            "CTX-002: clipping by value without a gradient_clip_val would clip nothing, and is refused",
        ):
            make_context(**given)
    make_context(gradient_clip_algorithm="norm")
    make_context(gradient_clip_algorithm="value", gradient_clip_val=0.5)


# -- CKPT-004: a state or copy taken inside batch() after a real step -----------------------------------------

_PENDING_BATCHES = make_batches(4, seed=15)
_OVERFLOW = 1
"""Under 16-mixed, the batch in which optimizer A's loss is infinite (A skips its step, the scale backs off)."""
_PENDING_SCALES = [2.0**10] * 2 + [2.0**11] * 2 + [2.0**10] * 2 + [2.0**11] * 2
"""Under 16-mixed, the scale of each backward pass (A's, then B's, per batch), worked by hand from ``GROWING``: one
update per iteration over both optimizers; batch 0 grows, batch 1 backs off (A overflowed), batch 2 grows."""
_TAKEN: dict[str, tuple[int, tuple[None, ...], dict[int, None]]] = {
    "overflow-then-B": (1, (None,), {1: None}),
    "overflow-and-B": (1, (None, None), {}),
    "finite-and-B": (2, (None, None), {}),
}
"""Where the state or copy is taken: the batch, the steps of that batch (A's, B's) that ran before, those after."""
_BOTH = (None, None)
_pending = partial(run_plan, batches=_PENDING_BATCHES, overflow=(_OVERFLOW, 0), factor=LOSS_FACTOR)
""":func:`.run_plan` of the pair (A's, then B's step each batch) on :data:`_PENDING_BATCHES`, A's loss of batch
:data:`_OVERFLOW` infinite under 16-mixed."""


def _pair(make_context: MakeContext, cell: Cell) -> tuple[TrainingContext, torch.nn.Module, list[Any]]:
    """A fresh context (one micro-step per window) with A and B (:func:`.layer_optimizers`, A's lr 0.5) wrapped."""
    context = make_context(**scaler_settings(cell, GROWING))
    model = context.prepare_module(make_model())
    return context, model, [context.wrap(inner) for inner in layer_optimizers(model, cell, sgd_lr=0.5)]


def _assert_pair_run(model: torch.nn.Module, scales: list[float], cell: Cell, what: str) -> None:
    """The scales by hand and the plain loop's parameters: A then B each batch, one ``GradScaler`` per iteration."""
    oracle, scaler = oracle_copy(make_model(), cell), plain_scaler(cell, GROWING)
    plain_epoch(
        cell,
        [(oracle, inner) for inner in layer_optimizers(oracle, cell, sgd_lr=0.5)],
        _PENDING_BATCHES,
        [[(0, 1), (1, 1)]] * len(_PENDING_BATCHES),
        scaler,
        blow_up={(_OVERFLOW, 0)} if scaler else (),
        before_forward=lambda *_: oracle.zero_grad(set_to_none=True),  # the other's parameters get none (toggled)
    )
    want = _PENDING_SCALES if scaler else []
    assert scales == want, (
        f"{what}: the backward passes were scaled by {scales}; a plain GradScaler updated once per iteration over "
        f"both optimizers scales them by {want}: the iteration's pending update was lost or applied twice"
    )
    assert_params_close(model, oracle, cell, what)


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
    batch_idx, before, after = _TAKEN[taken]
    context, model, wrappers = pair = _pair(make_context, cell)
    scales: list[float] = []
    _pending(*pair, dict.fromkeys(range(batch_idx), _BOTH), cell, scales=scales)
    with context.batch(batch_idx):
        _pending(*pair, {batch_idx: before}, cell, scales=scales, blocks=False)
        state = {
            "model": model.state_dict(),
            "optimizers": [wrapper.state_dict() for wrapper in wrappers],
            "context": context.state_dict(),
        }
        saved, resumed_scales = through_a_checkpoint(state), list(scales)
        _pending(*pair, {batch_idx: after}, cell, scales=scales, blocks=False)
    rest = dict.fromkeys(range(batch_idx + 1, len(_PENDING_BATCHES)), _BOTH)
    _pending(*pair, rest, cell, scales=scales)
    _assert_pair_run(model, scales, cell, f"the original, after a state was taken ({taken})")

    resumed = _pair(make_context, cell)
    resumed[1].load_state_dict(saved["model"])
    for wrapper, optimizer_state in zip(resumed[2], saved["optimizers"], strict=True):
        wrapper.load_state_dict(optimizer_state)
    with resumed[0].batch(batch_idx):
        resumed[0].load_state_dict(saved["context"])
        _pending(*resumed, {batch_idx: after}, cell, scales=resumed_scales, blocks=False)
    _pending(*resumed, rest, cell, scales=resumed_scales)
    _assert_pair_run(resumed[1], resumed_scales, cell, f"resumed from a state taken inside batch() ({taken})")


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
    batch_idx, before, after = _TAKEN[taken]
    pair = _pair(make_context, cell)
    scales: list[float] = []
    _pending(*pair, dict.fromkeys(range(batch_idx), _BOTH), cell, scales=scales)
    with pair[0].batch(batch_idx):
        _pending(*pair, {batch_idx: before}, cell, scales=scales, blocks=False)
        clone = pickle.loads(pickle.dumps(pair)) if how == "pickle" else copy.deepcopy(pair)
        copied = list(scales)
        _pending(*pair, {batch_idx: after}, cell, scales=scales, blocks=False)
    rest = dict.fromkeys(range(batch_idx + 1, len(_PENDING_BATCHES)), _BOTH)
    _pending(*pair, rest, cell, scales=scales)
    _assert_pair_run(pair[1], scales, cell, f"the original, after a {how} was taken ({taken})")
    assert clone[1] is not pair[1], f"the {how} shares the model"
    with clone[0].batch(batch_idx):  # the copy resumes in the block it was taken in
        _pending(clone[0], clone[1], clone[2], {batch_idx: after}, cell, scales=copied, blocks=False)
    _pending(clone[0], clone[1], clone[2], rest, cell, scales=copied)
    _assert_pair_run(clone[1], copied, cell, f"a {how} taken inside batch() ({taken}), continued")


# -- CKPT-004, CLIP-002: what a running step() and a prepared window refuse ------------------------------------


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
    settings = {"accumulate_grad_batches": 2, **failure_settings(on_failure)}
    rig = Rig(make_context, cell, make_batches(2, seed=16), seeds=(51, 52), **settings)
    rig.batch(0, "a", "b")  # a window of two micro-steps each, its first taken
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    takes: dict[str, Callable[[], object]] = {"context.state_dict()": rig.context.state_dict}
    if "pickling" in implementation.features:
        takes |= {
            "copy.deepcopy(context)": partial(copy.deepcopy, rig.context),
            "pickle.dumps(wrapper b)": partial(pickle.dumps, b),
        }
    held = 1
    with rig.context.batch(1):
        for (what, take), make_step in itertools.product(takes.items(), (False, True)):

            def closure(take: Callable[[], object] = take) -> None:
                a.backward(rig.loss("a", 1))
                take()

            call = f"wrapper a's step(closure, make_optimizer_step={make_step}) whose closure calls {what}"
            why = "CKPT-004: a state or copy taken while a step() runs is refused with RuntimeError"
            failing = partial(a.step, closure, make_optimizer_step=make_step)
            rig.fails(call, why, failing, raised=RuntimeError, discarded="a" if discard else None, held=held)
            held = 0 if discard else held
        a.backward(rig.loss("a", 1))
        a.unscale_gradients()
        for what, take in takes.items():
            call = f"{what} after wrapper a's unscale_gradients(), before its closing step()"
            why = "CKPT-004: a state or copy taken after unscale_gradients(), before the closing step(), is refused"
            rig.fails(call, why, take, raised=RuntimeError)
        a.step(make_optimizer_step=True)
        assert a.last_outcome is S, f"the prepared window's closing step: {a.last_outcome}"
        for take in takes.values():
            take()  # between calls, inside batch() after a real step: allowed
        rig.call("b", 1)
        assert b.last_outcome is S, f"wrapper b's window: {b.last_outcome}"
    rig.train_oracle({"a": [(1,) if discard else (0, 1)], "b": [(0, 1)]})
    rig.assert_oracle(f"two windows closed after refused states and copies ({on_failure})")


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
    settings = {"accumulate_grad_batches": 2, **failure_settings(on_failure)}
    rig = Rig(make_context, cell, make_batches(2, seed=16), seeds=(51, 52), **settings)
    rig.batch(0, "a", "b")  # a window of two micro-steps each, its first taken
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    with rig.context.batch(1):
        prepared = rig.closure("a", 1, unscale=True)

        def closure() -> None:
            prepared()
            a.backward(rig.loss("a", 1))

        call = (
            "wrapper a's step(closure, make_optimizer_step=True) whose closure calls backward() after "
            "unscale_gradients()"
        )
        why = (
            "CLIP-002: a backward() after unscale_gradients() adds scaled gradients to prepared ones, so it is "
            "refused until the closing step()"
        )
        failing = partial(a.step, closure, make_optimizer_step=True)
        rig.fails(call, why, failing, raised=RuntimeError, discarded="a" if discard else None, held=1)
        a.backward(rig.loss("a", 1))
        a.unscale_gradients()
        for name in ("a", "b"):
            call = f"wrapper {name}'s backward(loss) after wrapper a's unscale_gradients(), before a's closing step()"
            why = (
                "CLIP-002: a backward() of any wrapper of the context is refused between unscale_gradients() and "
                "the closing step()"
            )
            rig.fails(call, why, partial(rig.wrappers[name].backward, rig.loss(name, 1)), raised=RuntimeError)
        a.step(make_optimizer_step=True)
        assert a.last_outcome is S, f"the prepared window's closing step: {a.last_outcome}"
        b.backward(rig.loss("b", 1))  # the closing step has run: backward is allowed again
        b.step()
        assert b.last_outcome is S, f"wrapper b's window: {b.last_outcome}"
    rig.train_oracle({"a": [(1,) if discard else (0, 1)], "b": [(0, 1)]})
    rig.assert_oracle(f"two windows closed after refused backward() calls ({on_failure})")
