"""Checks of the failure policy (FAIL-001 to FAIL-006): what a ``step()`` that raises leaves behind.

``on_failure="discard"`` (the default) discards the window of a call that failed after one of its backwards wrote
into it, or in its real step; ``"restore"`` (the feature ``"exact_restore"``) puts it back exactly. Under both, a
refused call, and one that fails before any backward wrote, changes nothing. The checks of the rules that fail a
call (CLOS-003, TXN-001, REENT-001, HOOK-004, AMP-008, CLIP-002, CKPT-004) run under both policies in their own
modules; the checks here are of what the policy itself says.

Every expected value comes from a plain PyTorch loop beside the check (bare optimizers, ``torch.autocast`` and,
under 16-mixed, a plain ``torch.amp.GradScaler`` running torch's recipe) over the windows each policy leaves, worked
out by hand; never from the implementation under test.
"""

from __future__ import annotations

import copy
import io
import math
import pickle
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_same_grads, assert_same_values, grads, param_values
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
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    clipper,
    oracle_loss,
    plain_scaler,
    real_step,
    scaled_backward,
    update_scaler,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, D = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.DISCARDED

EAGER = ("cpu", "cuda")
"""The checks that train windows against an oracle run on the eager devices: no rule here depends on the device,
and on XLA every new graph compiles (the policy's construction check runs there too)."""

SGD_LR = 10.0
"""Large enough that a window's mean over a wrong length, or a micro-batch too many, moves the parameters far beyond
every precision's tolerance."""
ADAM_LR = 0.01


_KINDS: dict[str, tuple[type[torch.optim.Optimizer], type[torch.optim.Optimizer], dict[str, Any]]] = {
    "SGD": (FlakySGD, torch.optim.SGD, {"lr": SGD_LR}),
    "SGD momentum": (FlakySGD, torch.optim.SGD, {"lr": SGD_LR, "momentum": 0.9}),
    "Adam": (FlakyAdam, torch.optim.Adam, {"lr": ADAM_LR}),
}
"""The flaky optimizer of each kind, its plain twin for the oracle, and their hyper-parameters."""


@dataclass
class _Snapshot:
    """Everything FAIL-002 says a failed call must leave as it was, read from outside the implementation."""

    values: list[torch.Tensor]
    grads: dict[str, list[torch.Tensor | None]]
    flags: list[bool]
    outcomes: dict[str, StepOutcome | None]
    state: dict[str, Any] | None

    @classmethod
    def of(cls, rig: _Rig, *, state: bool) -> _Snapshot:
        return cls(
            param_values(list(rig.model.parameters())),
            {name: grads(params) for name, params in rig.params.items()},
            [p.requires_grad for p in rig.model.parameters()],
            {name: wrapper.last_outcome for name, wrapper in rig.wrappers.items()},
            copy.deepcopy(rig.context.state_dict()) if state else None,
        )

    def assert_unchanged(self, rig: _Rig, what: str, *, discarded: str | None = None) -> None:
        """As before, except the window of wrapper ``discarded`` (every gradient ``None``, ``DISCARDED``)."""
        now = _Snapshot.of(rig, state=False)
        assert_same_values(now.values, self.values, what)
        assert now.flags == self.flags, f"{what} changed requires_grad flags: {now.flags}, before {self.flags}"
        for name, window in self.grads.items():
            if name == discarded:
                assert_same_grads(now.grads[name], [None] * len(window), f"{what}, wrapper {name}'s discarded window")
                assert now.outcomes[name] is D, (
                    f"{what}: wrapper {name}'s last_outcome is {now.outcomes[name]}, expected DISCARDED [FAIL-003]"
                )
                continue
            assert_same_grads(now.grads[name], window, f"{what}, wrapper {name}'s window")
            assert now.outcomes[name] is self.outcomes[name], (
                f"{what}: wrapper {name}'s last_outcome is {now.outcomes[name]}, was {self.outcomes[name]}"
            )
        if self.state is not None and discarded is None:
            assert_same_state(rig.context.state_dict(), self.state, f"{what}, context.state_dict()")


class _Rig:
    """A context, a ``Halves`` model, wrapper ``a`` (a flaky optimizer) on half ``a`` and, with ``two``, an SGD ``b``.

    The oracle's copy of the model is taken before the context prepares it.
    """

    def __init__(self, make_context: MakeContext, cell: Cell, kind: str, *, two: bool, **settings: Any) -> None:
        self.cell = cell
        self.device, self.dtype = cell_device(cell), cell_dtype(cell)
        self.context = make_context(**settings)
        base = Halves(61, 62)
        oracle = oracle_copy(base, cell)
        model = self.context.prepare_module(base)
        assert isinstance(model, Halves) and isinstance(oracle, Halves)
        self.model, self.oracle = model, oracle
        flaky, _, hyper = _KINDS[kind]
        self.inner = flaky(model.a.parameters(), **hyper)
        self.wrappers: dict[str, Any] = {"a": self.context.wrap(self.inner)}
        self.halves: dict[str, torch.nn.Module] = {"a": model.a}
        if two:
            self.wrappers["b"] = self.context.wrap(torch.optim.SGD(model.b.parameters(), lr=SGD_LR))
            self.halves["b"] = model.b
        self.params = {name: list(half.parameters()) for name, half in self.halves.items()}

    @property
    def a(self) -> Any:
        return self.wrappers["a"]

    def loss(self, name: str, batch: Batch) -> torch.Tensor:
        """Half ``name``'s loss on ``batch``, its forward under the context's autocast."""
        with self.context.autocast():
            return mse(self.halves[name], batch, self.device, self.dtype) * LOSS_FACTOR

    def closure(self, name: str, batch: Batch, *, plain: bool = False, unscale: bool = False) -> Callable[[], Any]:
        """``step(closure)``'s closure: the forward, ``wrapper.backward`` (``loss.backward()`` with ``plain``)."""
        wrapper = self.wrappers[name]

        def closure() -> torch.Tensor:
            loss = self.loss(name, batch)
            if plain:
                loss.backward()
            else:
                wrapper.backward(loss)
            if unscale:
                wrapper.unscale_gradients()
            return loss

        return closure


def _oracle_run(
    cell: Cell,
    oracle: Halves,
    batches: Sequence[Batch],
    plans: dict[str, tuple[torch.optim.Optimizer, Sequence[Sequence[int]]]],
    *,
    accumulate: int,
    in_batch: bool,
    clip: float | None = None,
    settings: GradScalerSettings | None = None,
) -> list[float]:
    """The plain loop over each half's windows; the scale each backward pass used (16-mixed only).

    Per batch, each half in order backpropagates if one of its windows holds the batch, and steps on the window's
    mean (unscaled, clipped by norm) at its last batch; one ``GradScaler`` (torch's recipe, AMP-007), updated at the
    end of each batch in which an optimizer stepped (``in_batch``) or after each real step (AMP-003).
    """
    scaler = plain_scaler(cell, settings)
    clip_norm = None if clip is None else clipper("norm", clip)
    halves = {"a": oracle.a, "b": oracle.b}
    scales: list[float] = []
    for batch_idx, batch in enumerate(batches):
        stepped = False
        for name, (optimizer, windows) in plans.items():
            window = next((w for w in windows if batch_idx in w), None)
            if window is None:
                continue
            scaled_backward(oracle_loss(halves[name], batch, cell), scaler, accumulate, scales=scales)
            if batch_idx != window[-1]:
                continue
            real_step(optimizer, len(window), scaler, accumulate, clip=clip_norm)
            stepped = True
            if not in_batch:
                update_scaler(scaler)
            oracle_step_done(cell)
        if stepped and in_batch:
            update_scaler(scaler)
    return scales


# -- FAIL-001: the policy is a construction setting -----------------------------------------------------------

_BAD_POLICIES: list[object] = ["Discard", "rollback", "", None, True, 0, ("discard",)]


@pytest.mark.requirement("FAIL-001")
@pytest.mark.cells(precisions=("32-true", "16-mixed"))
@pytest.mark.varies(faults=("invalid argument",), on_failure=("discard", "restore"))
def test_failure_policy_is_a_construction_setting(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any]
) -> None:
    """``on_failure`` reads back what construction was given, ``"discard"`` by default; anything else is refused.

    Any value but ``"discard"`` and ``"restore"`` raises ``ValueError`` at construction. ``"restore"`` is taken by an
    implementation that claims ``"exact_restore"``; one that does not may refuse it with ``ValueError`` instead.
    """
    default = make_context()
    assert default.on_failure == "discard", f"a context built without on_failure reads {default.on_failure!r}"
    assert make_context(on_failure="discard").on_failure == "discard"
    for bad in _BAD_POLICIES:
        with refuses(
            ValueError,
            f"factory(cell, on_failure={bad!r})",
            "FAIL-001: on_failure is 'discard' or 'restore'; any other value is refused at construction",
        ):
            make_context(on_failure=bad)
    if "exact_restore" in implementation.features:
        restoring = make_context(on_failure="restore")
        assert restoring.on_failure == "restore", f"on_failure='restore' reads back {restoring.on_failure!r}"
        return
    try:
        restoring = make_context(on_failure="restore")
    except ValueError:
        return  # not claimed: refusing it is allowed (FAIL-001)
    assert restoring.on_failure == "restore", f"on_failure='restore', accepted, reads back {restoring.on_failure!r}"


# -- FAIL-002: a refused call, or one that fails before any backward wrote, changes nothing -------------------


def _planted_hook(rig: _Rig, implementation: ImplementationInfo[Any]) -> Callable[[], Any] | None:
    """A ``before_backward`` hook that raises, registered; its handle's ``remove`` (``None`` without hooks)."""
    if "hooks" not in implementation.features:
        return None

    def before_backward(wrapper: Any, loss: torch.Tensor) -> None:
        raise PlannedFailure("the before_backward hook fails (planted by the check)")

    handle = rig.context.register_hooks(before_backward=before_backward)
    return handle.remove


def _failing_closures(
    rig: _Rig, batch: Batch, implementation: ImplementationInfo[Any]
) -> tuple[list[tuple[str, Callable[[], Any], type[BaseException]]], Callable[[], Any]]:
    """Wrapper ``a``'s closures that fail before any backward writes into its window, and the one a hook fails."""
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    outside = torch.zeros(3, device=rig.device, dtype=rig.dtype, requires_grad=True)

    def raise_at_once() -> None:
        raise PlannedFailure("the closure fails at once")

    def forward_then_raise() -> None:
        rig.loss("a", batch)
        raise PlannedFailure("the closure fails after its forward pass")

    def zero_grad_then_raise() -> None:
        a.zero_grad()
        b.zero_grad(set_to_none=False)
        rig.loss("a", batch)
        raise PlannedFailure("the closure fails after zero_grad() of both wrappers (both windows open: no-ops)")

    def autograd_grad_then_raise() -> None:
        loss = rig.loss("a", batch)
        torch.autograd.grad(loss, rig.params["a"])
        raise PlannedFailure("the closure fails after torch.autograd.grad, which writes no .grad")

    def backward_elsewhere_then_raise() -> None:
        a.backward((outside * 2.0).sum())
        raise PlannedFailure("the closure fails after a backward that wrote no gradient of the window")

    def reentering() -> None:
        rig.loss("a", batch)
        b.step(rig.closure("b", batch))

    def hooked() -> None:
        a.backward(rig.loss("a", batch))

    failing: list[tuple[str, Callable[[], Any], type[BaseException]]] = [
        ("a closure that raises at once", raise_at_once, PlannedFailure),
        ("a closure that raises after its forward pass", forward_then_raise, PlannedFailure),
        ("a closure that raises after zero_grad() of both wrappers", zero_grad_then_raise, PlannedFailure),
        ("a closure that raises after torch.autograd.grad", autograd_grad_then_raise, PlannedFailure),
        (
            "a closure whose wrapper.backward wrote no gradient of the window",
            backward_elsewhere_then_raise,
            PlannedFailure,
        ),
        ("a closure that re-enters step()", reentering, RuntimeError),
    ]
    if "hooks" in implementation.features:
        failing.append(("a closure whose backward's before_backward hook raises", hooked, PlannedFailure))
    return failing, hooked


def _fail_with_both_windows_open(
    rig: _Rig, implementation: ImplementationInfo[Any], batch: Batch, on_failure: str, state: bool
) -> None:
    """Wrapper ``a``'s failing and refused calls, both windows open: each changes nothing [FAIL-002].

    Then a call whose closure ran ``loss.backward()`` before raising: discarded or restored [FAIL-003, FAIL-004].
    """
    a = rig.wrappers["a"]
    failing, hooked = _failing_closures(rig, batch, implementation)
    for make_step in (False, True):
        for what, closure, raised in failing:
            call = f"wrapper a's step(make_optimizer_step={make_step}) with {what} (on_failure={on_failure!r})"
            before = _Snapshot.of(rig, state=state)
            remove = _planted_hook(rig, implementation) if closure is hooked else None
            try:
                with refuses(
                    raised, call, "FAIL-002: the exception of a call that fails before any backward wrote propagates"
                ):
                    a.step(closure, make_optimizer_step=make_step)
            finally:
                if remove is not None:
                    remove()
            before.assert_unchanged(rig, f"{call}: it failed before any backward wrote (FAIL-002)")
        refused: list[tuple[str, dict[str, Any]]] = [
            ("closure=3", {"closure": 3}),
            ("make_optimizer_step='yes'", {"closure": rig.closure("a", batch), "make_optimizer_step": "yes"}),
        ]
        for what, arguments in refused:
            before = _Snapshot.of(rig, state=state)
            with refuses(
                TypeError,
                f"wrapper a's step({what})",
                "ERR-001, ERR-002: a bad argument is refused with TypeError before anything runs",
            ):
                a.step(**arguments)
            before.assert_unchanged(rig, f"wrapper a's refused step({what}) (FAIL-002)")
    # A plain loss.backward() writes into the window as a wrapper's backward does [FAIL-002].
    before = _Snapshot.of(rig, state=state)

    def plain_then_raise() -> None:
        rig.loss("a", batch).backward()
        raise PlannedFailure("the closure fails after loss.backward()")

    call = f"wrapper a's step() whose closure raises after loss.backward() (on_failure={on_failure!r})"
    with refuses(PlannedFailure, call, "CLOS-003: the closure's exception propagates") as error:
        a.step(plain_then_raise, make_optimizer_step=False)
    if on_failure == "discard":
        before.assert_unchanged(rig, f"{call}: loss.backward() wrote into the window (FAIL-003)", discarded="a")
        assert_discard_note(error.value, a.optimizer, (1, 2), call)
    else:
        before.assert_unchanged(rig, f"{call} (FAIL-004)")


def _fail_on_a_prepared_window(rig: _Rig, batch: Batch, on_failure: str) -> None:
    """A window prepared by ``unscale_gradients()``: failed closing steps and refused calls change nothing.

    The closing micro-step in the backward-then-step form, prepared by hand: the closing step's closure fails
    before any backward, and the stage refuses what it forbids [FAIL-002, CLIP-002].
    """
    a = rig.wrappers["a"]
    a.backward(rig.loss("a", batch))
    a.unscale_gradients()

    def forward_then_raise_prepared() -> None:
        rig.loss("a", batch)
        raise PlannedFailure("the closing step's closure fails after its forward pass")

    def backward_refused() -> None:
        a.backward(rig.loss("a", batch))  # refused: the window is prepared (CLIP-002)

    for what, closure, raised in (
        ("a closure that raises after its forward pass", forward_then_raise_prepared, PlannedFailure),
        ("a closure whose backward is refused", backward_refused, RuntimeError),
    ):
        for closing in (None, True):
            call = (
                f"wrapper a's closing step(make_optimizer_step={closing}) of a window unscale_gradients() "
                f"prepared, with {what} (on_failure={on_failure!r})"
            )
            before = _Snapshot.of(rig, state=False)
            with refuses(raised, call, "FAIL-002: the closure's exception propagates"):
                a.step(closure, make_optimizer_step=closing)
            before.assert_unchanged(rig, f"{call}: no backward wrote, the prepared window stays (FAIL-002)")
    for what, refused_call in (
        ("step(make_optimizer_step=False)", lambda: a.step(make_optimizer_step=False)),
        ("zero_grad()", a.zero_grad),
    ):
        before = _Snapshot.of(rig, state=False)
        with refuses(
            RuntimeError,
            f"wrapper a's {what} after unscale_gradients(), before the closing step()",
            "CLIP-002: a stage that forbids the call refuses it, changing nothing (FAIL-002)",
        ):
            refused_call()
        before.assert_unchanged(rig, f"wrapper a's refused {what} on a prepared window (FAIL-002)")


@pytest.mark.requirement("FAIL-002", "FAIL-003", "FAIL-004", "REENT-001", "ERR-001", "ERR-002", "CLIP-002")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    faults=(
        "raising closure",
        "raising closure after its backward",
        "raising hook",
        "re-entered step",
        "invalid argument",
    ),
    on_failure=("discard", "restore"),
    wrappers=("2",),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    call_form=("closure, wrapper.backward", "closure, loss.backward", "backward, then step()"),
    clipping=("unscale_gradients() by hand",),
    position=("inside batch()",),
    zero_grad=("with a window open", "of another wrapper"),
    optimizer=("SGD",),
)
def test_a_call_that_fails_before_any_backward_changes_nothing(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any], on_failure: str
) -> None:
    """Closures that raise before any backward wrote a gradient of the window, and refused calls: nothing changes.

    With both wrappers' windows open (one micro-step each), wrapper ``a``'s calls fail after a forward pass, after
    ``zero_grad()`` of both wrappers, after ``torch.autograd.grad`` (which writes no gradient), after a
    ``wrapper.backward`` of a loss that reaches none of the window's parameters, in a ``before_backward`` hook, or
    because the closure re-entered ``step()``; others are refused (a closure that is not callable, a
    ``make_optimizer_step`` that is not a bool, a ``step(make_optimizer_step=False)`` or ``zero_grad()`` after
    ``unscale_gradients()``), and the closing step of that prepared window fails in its closure before any backward
    (which the stage refuses). Under either policy each leaves both windows' gradients, the parameters, the flags,
    both ``last_outcome`` values and (where checkpointing is claimed) the context's state as they were. A closure that
    ran ``loss.backward()`` before raising did write: its window is discarded under ``"discard"``, as before under
    ``"restore"``. Both windows then close on time and match the plain loop over the windows each policy leaves.
    """
    discard = on_failure == "discard"
    rig = _Rig(make_context, cell, "SGD", two=True, accumulate_grad_batches=3, **failure_settings(on_failure))
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    batches = make_batches(3, seed=21)
    state = "checkpointing" in implementation.features
    with rig.context.batch(0):
        a.step(rig.closure("a", batches[0]))
        b.step(rig.closure("b", batches[0]))
    with rig.context.batch(1):
        _fail_with_both_windows_open(rig, implementation, batches[1], on_failure, state)
        a.step(rig.closure("a", batches[1]))
        b.step(rig.closure("b", batches[1]))
    with rig.context.batch(2):
        _fail_on_a_prepared_window(rig, batches[2], on_failure)
        a.step()
        b.step(rig.closure("b", batches[2]))
    assert a.last_outcome is S and b.last_outcome is S, (
        f"after the failed and refused calls the windows did not close on time: {a.last_outcome}, {b.last_outcome}"
    )
    a_window = (1, 2) if discard else (0, 1, 2)
    plans: dict[str, tuple[torch.optim.Optimizer, Sequence[Sequence[int]]]] = {
        "a": (torch.optim.SGD(rig.oracle.a.parameters(), lr=SGD_LR), [a_window]),
        "b": (torch.optim.SGD(rig.oracle.b.parameters(), lr=SGD_LR), [(0, 1, 2)]),
    }
    _oracle_run(cell, rig.oracle, batches, plans, accumulate=3, in_batch=True)
    assert_params_close(rig.model, rig.oracle, cell, f"the windows {a_window} and (0, 1, 2) ({on_failure})")


# -- FAIL-003: a discarded window ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Discard:
    """One epoch of wrapper ``a`` (and ``b``) in which one call of ``a`` fails after its window was written.

    ``where``: ``"closure"`` (the closure raises after its backward), ``"hook"`` (``before_optimizer_step`` raises on
    the prepared window), ``"inner"`` (the inner step raises), ``"prepared"`` (``unscale_gradients()``, then the
    closing step's inner step raises), ``"prepared closure"`` (the closure runs its backward and
    ``unscale_gradients()``, then raises). ``retry``: ``"same"`` (the call again, as planned), ``"skip"`` (the batch is
    dropped), ``"accumulate"`` (the micro-batch again with ``make_optimizer_step=False``).
    """

    accumulate: int
    kind: str
    form: str
    """``"closure"`` (``wrapper.backward``), ``"plain"`` (``loss.backward()``: the failing closure always, the others
    outside 16-mixed) or ``"backward"`` (backward, then ``step()``)."""
    where: str
    batches: int
    failing: int
    held: int
    """Micro-steps ``a``'s window held before the failing call."""
    windows: tuple[tuple[int, ...], ...]
    """``a``'s windows, by hand: the discarded one is gone, the next starts at the retry."""
    outcomes: tuple[StepOutcome, ...]
    """``a``'s ``last_outcome`` after each batch."""
    schedule: dict[int, bool | None] = field(default_factory=dict)
    in_batch: bool = True
    retry: str = "same"
    other: tuple[bool | None, ...] | None = None
    """``b``'s ``make_optimizer_step`` per batch (called after ``a`` in each batch), or no ``b``."""
    other_windows: tuple[tuple[int, ...], ...] = ()


_DISCARDS = {
    "closure-after-backward-2-wrappers": _Discard(
        3,
        "SGD momentum",
        "closure",
        "closure",
        6,
        1,
        1,
        ((1, 2), (3, 4, 5)),
        (A, A, S, A, A, S),
        other=(None,) * 6,
        other_windows=((0, 1, 2), (3, 4, 5)),
    ),
    "plain-backward-cut-short": _Discard(
        4, "Adam", "plain", "closure", 7, 3, 3, ((3,), (4, 5, 6)), (A, A, A, S, A, A, S), schedule={3: True}
    ),
    "inner-step-outside-batch-skipped": _Discard(
        2,
        "SGD momentum",
        "backward",
        "inner",
        4,
        1,
        1,
        ((2, 3),),
        (A, D, A, S),
        in_batch=False,
        retry="skip",
        other=(True,) * 4,
        other_windows=((0,), (1,), (2,), (3,)),
    ),
    "hook-flushed": _Discard(
        3,
        "Adam",
        "closure",
        "hook",
        5,
        4,
        1,
        ((0, 1, 2), (4,)),
        (A, A, S, A, S),
        other=(False, False, False, False, None),
        other_windows=((0, 1, 2, 3, 4),),
    ),
    "prepared-then-accumulated": _Discard(
        2,
        "SGD",
        "backward",
        "prepared",
        4,
        1,
        1,
        ((1, 2, 3),),
        (A, A, A, S),
        retry="accumulate",
        other=(None,) * 4,
        other_windows=((0, 1), (2, 3)),
    ),
    "prepared-in-closure-same-iteration": _Discard(
        1,
        "SGD momentum",
        "closure",
        "prepared closure",
        3,
        1,
        0,
        ((0,), (1,), (2,)),
        (S, S, S),
        other=(False, False, True),
        other_windows=((0, 1, 2),),
    ),
    "closure-after-backward-outside-batch": _Discard(
        3, "SGD", "closure", "closure", 5, 2, 2, ((2, 3, 4),), (A, A, A, A, S), in_batch=False
    ),
}


@dataclass
class _DiscardRun:
    """Wrapper ``a``'s calls in a :class:`_Discard` plan: the planned ones, and the one that fails."""

    plan: _Discard
    rig: _Rig
    batches: list[Batch]
    plain: bool
    """The closures run ``loss.backward()`` (the plan's ``"plain"`` form, outside 16-mixed)."""

    def call(self, batch_idx: int, *, make_step: bool | None = None, unscale: bool = False) -> None:
        """The planned call of ``batch_idx`` (or with ``make_step``), its window prepared first with ``unscale``."""
        a, plan, batch = self.rig.a, self.plan, self.batches[batch_idx]
        make_step = plan.schedule.get(batch_idx) if make_step is None else make_step
        if plan.form == "backward":
            a.backward(self.rig.loss("a", batch))
            if unscale:
                a.unscale_gradients()
            a.step(make_optimizer_step=make_step)
        else:
            a.step(self.rig.closure("a", batch, plain=self.plain, unscale=unscale), make_optimizer_step=make_step)

    def fail(self, batch_idx: int) -> None:
        """The call of ``batch_idx``, failing where the plan says, after its window was written."""
        a, plan, batch = self.rig.a, self.plan, self.batches[batch_idx]
        if plan.where in ("closure", "prepared closure"):

            def closure() -> None:
                loss = self.rig.loss("a", batch)
                if plan.form == "plain":
                    loss.backward()
                else:
                    a.backward(loss)
                if plan.where == "prepared closure":
                    a.unscale_gradients()
                raise PlannedFailure("the closure fails after its backward")

            a.step(closure, make_optimizer_step=plan.schedule.get(batch_idx))
        elif plan.where == "hook":

            def before_optimizer_step(wrapper: Any) -> None:
                if wrapper is a:
                    raise PlannedFailure("the before_optimizer_step hook fails")

            handle = self.rig.context.register_hooks(before_optimizer_step=before_optimizer_step)
            try:
                self.call(batch_idx)
            finally:
                handle.remove()
        else:
            self.rig.inner.fail = True  # type: ignore[attr-defined]
            try:
                self.call(batch_idx, unscale=plan.where == "prepared")
            finally:
                self.rig.inner.fail = False  # type: ignore[attr-defined]

    def fail_and_retry(self, batch_idx: int, what: str) -> None:
        """The failing call discards ``a``'s window and only it [FAIL-003]; then the retry the plan makes."""
        a, plan, rig = self.rig.a, self.plan, self.rig
        prepared = plan.where in ("prepared", "prepared closure")
        before = _Snapshot.of(rig, state=False)
        with refuses(PlannedFailure, what, "CLOS-003, TXN-001, HOOK-004: the failure propagates") as raised:
            self.fail(batch_idx)
        before.assert_unchanged(rig, what, discarded="a")
        assert_discard_note(raised.value, a.optimizer, (plan.held, plan.held + 1), what)
        if prepared:
            a.zero_grad()  # the discarded window is not prepared any more: zero_grad() is taken
            assert_same_grads(grads(rig.params["a"]), [None] * len(rig.params["a"]), f"{what}, zero_grad()")
        if plan.retry == "same":
            self.call(batch_idx, unscale=prepared)
        elif plan.retry == "accumulate":
            self.call(batch_idx, make_step=False)


@pytest.mark.requirement("FAIL-003", "FAIL-002", "CLOS-003", "TXN-001", "HOOK-004", "STEP-004", "ACC-001", "AMP-003")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize(
    "scenario",
    [  # a hook that raises needs the feature: n/a (deselected) where it is not claimed
        pytest.param(name, marks=pytest.mark.features("hooks")) if plan.where == "hook" else name
        for name, plan in _DISCARDS.items()
    ],
)
@pytest.mark.varies(
    on_failure=("discard",),
    faults=(
        "raising closure after its backward",
        "raising hook",
        "raising inner step",
        "failing closing step of a prepared window",
    ),
    window=(
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "partial, flushed by the last batch",
        "open while another optimizer steps",
    ),
    wrappers=("1", "2"),
    optimizer=("SGD", "SGD momentum", "Adam"),
    call_form=("closure, wrapper.backward", "closure, loss.backward", "backward, then step()"),
    make_optimizer_step=("True", "False", "None"),
    position=("inside batch()", "outside batch()"),
    clipping=("unscale_gradients() by hand",),
    outcome_read=("after every call of every wrapper",),
)
def test_a_discarded_window_is_gone_and_the_next_is_exact(make_context: MakeContext, cell: Cell, scenario: str) -> None:
    """Under the default policy a call that fails after its window was written discards that window, and only it.

    Right after the failure every gradient of the wrapper's parameters is ``None``, its ``last_outcome`` is
    ``DISCARDED``, the exception carries a note naming the optimizer, the micro-steps discarded and
    ``on_failure="restore"``; the parameters, the flags and the other wrapper's open window and outcome are as they
    were. A prepared window is no longer prepared (``zero_grad()`` and an accumulating ``step()`` are taken), the
    window's length is 0 (the schedule outside ``batch()`` counts the next window from its first micro-step) and the
    loss scaler has forgotten the discarded window (its retry in the same iteration is unscaled once again). The next
    window is exact: the parameters match a plain loop over the windows left, worked out by hand.
    """
    plan = _DISCARDS[scenario]
    sixteen = cell.precision == "16-mixed"
    rig = _Rig(make_context, cell, plan.kind, two=plan.other is not None, accumulate_grad_batches=plan.accumulate)
    batches = make_batches(plan.batches, seed=23)
    run = _DiscardRun(plan, rig, batches, plain=plan.form == "plain" and not sixteen)
    outcomes: list[StepOutcome | None] = []
    for batch_idx in range(plan.batches):
        last = batch_idx == plan.batches - 1
        block: AbstractContextManager[None] = (
            rig.context.batch(batch_idx, is_last=last) if plan.in_batch else nullcontext()
        )
        with block:
            if batch_idx == plan.failing:
                run.fail_and_retry(batch_idx, f"{scenario}: wrapper a's failed call in batch {batch_idx}")
            else:
                run.call(batch_idx)
            outcomes.append(rig.a.last_outcome)
            if plan.other is not None:
                rig.wrappers["b"].step(rig.closure("b", batches[batch_idx]), make_optimizer_step=plan.other[batch_idx])
    assert outcomes == list(plan.outcomes), (
        f"{scenario}: wrapper a's last_outcome after each batch {outcomes}, expected {list(plan.outcomes)} (the "
        f"windows {plan.windows}: the discarded window's length is 0, the next counts from its first micro-step)"
    )
    _, plain_class, hyper = _KINDS[plan.kind]
    plans: dict[str, tuple[torch.optim.Optimizer, Sequence[Sequence[int]]]] = {
        "a": (plain_class(rig.oracle.a.parameters(), **hyper), plan.windows)
    }
    if plan.other is not None:
        plans["b"] = (torch.optim.SGD(rig.oracle.b.parameters(), lr=SGD_LR), plan.other_windows)
    _oracle_run(cell, rig.oracle, batches, plans, accumulate=plan.accumulate, in_batch=plan.in_batch)
    model = rig.model if plan.other is not None else rig.model.a
    want = rig.oracle if plan.other is not None else rig.oracle.a
    assert_params_close(model, want, cell, f"{scenario}: after a discarded window, the windows {plan.windows}")


# -- FAIL-003, FAIL-004: the loss scaler's record of a failed window -----------------------------------------

GROWING = GradScalerSettings(init_scale=2.0**10, growth_interval=1)
"""The scale doubles after every iteration in which an optimizer stepped and nothing overflowed, and halves after one
that recorded an overflow: a found-inf the scaler kept of a failed window shows in the next scales."""


def _b_fails_after_unscaling(rig: _Rig, batch: Batch, failing: str, on_failure: str, scales: list[float]) -> bool:
    """Wrapper ``b``'s closing call fails after its window was unscaled; whether the restored window then stepped.

    ``closure``: the closure backpropagates an infinite loss, unscales and raises. ``inner-step``: the window is
    prepared by ``unscale_gradients()`` and the inner step raises; under ``"restore"`` the retry steps it here.
    """
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    if failing == "closure":

        def overflowing() -> None:
            b.backward(rig.loss("b", batch) * math.inf)
            b.unscale_gradients()
            raise PlannedFailure("the closure fails after unscaling an overflowing window")

        before = _Snapshot.of(rig, state=False)
        call = f"wrapper b's closing step() whose closure unscaled an overflow, then raised ({on_failure})"
        with refuses(PlannedFailure, call, "CLOS-003: the closure's exception propagates"):
            b.step(overflowing)
        before.assert_unchanged(rig, call, discarded="b" if on_failure == "discard" else None)
        return False
    loss = rig.loss("b", batch)
    loss.register_hook(lambda grad: scales.append(float(grad)))
    b.backward(loss)
    b.unscale_gradients()
    inner = b.optimizer

    def raising(*args: Any, **kwargs: Any) -> None:
        raise PlannedFailure("the inner step fails on purpose")

    inner.step = raising
    call = "wrapper b's closing step() of a window unscale_gradients() prepared, its inner step raising"
    try:
        with refuses(PlannedFailure, call, "TXN-001: the inner step's exception propagates"):
            b.step(make_optimizer_step=True)
    finally:
        del inner.step
    if on_failure == "restore":
        b.step(make_optimizer_step=True)  # the prepared window is back: its step applies it
        assert a.last_outcome is S and b.last_outcome is S, f"batch 1: {b.last_outcome} after the retry"
        return True
    assert b.last_outcome is StepOutcome.DISCARDED, f"the failed call left {b.last_outcome}, not DISCARDED"
    return False


@pytest.mark.requirement("FAIL-003", "FAIL-004", "AMP-003", "CLIP-002")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.parametrize("failing", ["closure", "inner-step"])
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    on_failure=("discard", "restore"),
    faults=("raising closure after its backward", "raising inner step", "failing closing step of a prepared window"),
    loss_scale=("grown", "settings given to the factory"),
    clipping=("unscale_gradients() by hand",),
    wrappers=("2",),
    window=("1 micro-step",),
    position=("inside batch()",),
    call_form=("closure, wrapper.backward", "backward, then step()"),
)
def test_a_failed_window_leaves_no_found_inf_behind(
    make_context: MakeContext, cell: Cell, on_failure: str, failing: str
) -> None:
    """16-mixed: a window unscaled, whose closing step then fails, leaves nothing in the loss scaler's records.

    In the iteration, ``a`` steps on finite gradients. ``closure``: ``b``'s closure backpropagates an infinite loss,
    calls ``unscale_gradients()`` (the scaler records the overflow for ``b``'s optimizer) and raises.
    ``inner-step``: ``b`` backpropagates a finite loss, ``unscale_gradients()`` prepares the window before its
    closing ``step()`` (the scaler records ``b`` as unscaled), and the inner step raises. Under ``"discard"`` the
    window is discarded and the scaler forgets what it recorded of it, so the retry's fresh window is unscaled once
    (not applied still scaled); under ``"restore"`` the prepared window comes back, with the scaler's record of it
    (``inner-step``), or the record is as before the call (``closure``), and the retry closes it. Either way the
    iteration's update sees finite steps alone: the scale grows as in the plain loop where ``b``'s failed attempt
    never ran, and every later backward uses the plain loop's scale.
    """
    rig = _Rig(make_context, cell, "SGD", two=True, grad_scaler=GROWING, **failure_settings(on_failure))
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    batches = make_batches(3, seed=25)
    scales: list[float] = []

    def recorded(name: str, batch: Batch) -> Callable[[], torch.Tensor]:
        def closure() -> torch.Tensor:
            loss = rig.loss(name, batch)
            loss.register_hook(lambda grad: scales.append(float(grad)))
            rig.wrappers[name].backward(loss)
            return loss

        return closure

    for batch_idx, batch in enumerate(batches):
        with rig.context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            a.step(recorded("a", batch))
            if batch_idx == 1 and _b_fails_after_unscaling(rig, batch, failing, on_failure, scales):
                continue
            b.step(recorded("b", batch))
            assert a.last_outcome is S and b.last_outcome is S, f"batch {batch_idx}: {a.last_outcome}, {b.last_outcome}"
    plans: dict[str, tuple[torch.optim.Optimizer, Sequence[Sequence[int]]]] = {
        "a": (torch.optim.SGD(rig.oracle.a.parameters(), lr=SGD_LR), [(0,), (1,), (2,)]),
        "b": (torch.optim.SGD(rig.oracle.b.parameters(), lr=SGD_LR), [(0,), (1,), (2,)]),
    }
    want = _oracle_run(cell, rig.oracle, batches, plans, accumulate=1, in_batch=True, settings=GROWING)
    assert want == [2.0**10] * 2 + [2.0**11] * 2 + [2.0**12] * 2, f"the plain loop's scales {want}"
    if failing == "inner-step" and on_failure == "discard":
        want = [*want[:3], want[3], *want[3:]]  # b's failed attempt backpropagated at batch 1's scale too
    assert scales == want, (
        f"the backward passes were scaled by {scales}, the plain loop's by {want}: the failed window's overflow, "
        "which the loss scaler recorded when it was unscaled, was not forgotten (FAIL-003, FAIL-004)"
    )
    assert_params_close(rig.model, rig.oracle, cell, f"after the failed overflowing window ({on_failure})")


# -- FAIL-004: restore returns to the last successful call ---------------------------------------------------

CLIP = 2e-4
"""A norm the windows' gradients exceed: the preparation of a real step changes them in place."""


@dataclass
class _Restored:
    """Failures of wrapper ``a``'s calls under ``"restore"``, each checked to leave everything as before [FAIL-004]."""

    rig: _Rig
    state: bool
    """Whether the context's state is compared too (checkpointing claimed)."""
    hooks: bool

    def expect(self, what: str, failing: Callable[[], Any], *, prepared: bool = False) -> None:
        """``failing()`` raises the planted failure and leaves the rig as it was."""
        before = _Snapshot.of(self.rig, state=self.state and not prepared)
        with refuses(PlannedFailure, what, "CLOS-003, TXN-001, HOOK-004: the failure propagates"):
            failing()
        before.assert_unchanged(self.rig, f"{what}: under on_failure='restore' (FAIL-004)")

    def after_backward(self, batch: Batch) -> Callable[[], None]:
        """A closure that raises after its backward."""

        def closure() -> None:
            self.rig.wrappers["a"].backward(self.rig.loss("a", batch))
            raise PlannedFailure("the closure fails after its backward")

        return closure

    def inner_fails(self, call: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` with the inner optimizer's step raising."""

        def failing() -> None:
            self.rig.inner.fail = True  # type: ignore[attr-defined]
            try:
                call()
            finally:
                self.rig.inner.fail = False  # type: ignore[attr-defined]

        return failing

    def hook_fails(self, call: Callable[[], Any]) -> Callable[[], Any]:
        """``call`` with a ``before_optimizer_step`` hook that raises."""

        def failing() -> None:
            def before_optimizer_step(wrapper: Any) -> None:
                raise PlannedFailure("the before_optimizer_step hook fails")

            handle = self.rig.context.register_hooks(before_optimizer_step=before_optimizer_step)
            try:
                call()
            finally:
                handle.remove()

        return failing

    def batch(self, batch_idx: int, batch: Batch) -> None:
        """Batch ``batch_idx``'s failures of wrapper ``a``, then its successful call."""
        a, where = self.rig.wrappers["a"], f"batch {batch_idx}"
        if batch_idx in (0, 1, 3, 6, 7):
            self.expect(
                f"{where}: a closure that raises after its backward", partial(a.step, self.after_backward(batch))
            )
        if batch_idx == 1:
            self.expect(
                f"{where}: a step cut short whose inner step raises",
                self.inner_fails(partial(a.step, self.rig.closure("a", batch), make_optimizer_step=True)),
            )
        if batch_idx == 2 and self.hooks:
            self.expect(
                f"{where}: a closing step whose before_optimizer_step hook raises",
                self.hook_fails(partial(a.step, self.rig.closure("a", batch))),
            )
        if batch_idx == 7:
            a.zero_grad(set_to_none=False)  # a window is open: nothing happens [ZERO-002]
            self.expect(
                f"{where}: again, after zero_grad(set_to_none=False)", partial(a.step, self.after_backward(batch))
            )
        if batch_idx == 4:
            a.backward(self.rig.loss("a", batch))
            self.expect(
                f"{where}: a step() cut short after its backward, whose inner step raises",
                self.inner_fails(lambda: a.step(make_optimizer_step=True)),
            )
            a.step()
        elif batch_idx == 8:
            a.backward(self.rig.loss("a", batch))
            a.unscale_gradients()
            self.expect(
                f"{where}: the closing step() of a prepared window, whose inner step raises",
                self.inner_fails(a.step),
                prepared=True,
            )
            with refuses(
                RuntimeError,
                "wrapper a's zero_grad() after unscale_gradients() and a failed closing step()",
                "CLIP-002, FAIL-004: the restored window is still prepared; zero_grad() is refused",
            ):
                a.zero_grad()
            a.step()
        else:
            a.step(self.rig.closure("a", batch))


@pytest.mark.requirement("FAIL-004", "CLOS-003", "TXN-001", "HOOK-004", "CLIP-001", "CLIP-002")
@pytest.mark.features("exact_restore")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(
    on_failure=("restore",),
    faults=(
        "raising closure after its backward",
        "raising inner step",
        "raising hook",
        "failing closing step of a prepared window",
    ),
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    make_optimizer_step=("True", "None"),
    clipping=("norm", "unscale_gradients() by hand"),
    zero_grad=("set_to_none=False", "with a window open"),
    wrappers=("2",),
    optimizer=("SGD momentum", "SGD"),
    position=("inside batch()",),
)
def test_restore_returns_to_the_last_successful_call(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any]
) -> None:
    """Under ``"restore"`` every failed call leaves the window as the last successful call left it, bit for bit.

    Three windows of three micro-steps, clipped by norm, beside an SGD wrapper: failures on an empty window (the
    first, and right after each real step), after one and after two successful micro-steps (``zero_grad()`` in
    between), in the closure after its backward, in the inner step of a call cut short (the window averaged,
    unscaled and clipped in place first; in the closure form and after a backward outside the call), in
    ``before_optimizer_step``, and in the closing step of a window ``unscale_gradients()`` prepared (still prepared
    afterwards). After each: the gradients, parameters, flags,
    both outcomes and (where checkpointing is claimed) the context's state are as before the call. The windows are
    then the plain loop's, as if no call had failed.
    """
    rig = _Rig(
        make_context,
        cell,
        "SGD momentum",
        two=True,
        accumulate_grad_batches=3,
        gradient_clip_val=CLIP,
        on_failure="restore",
    )
    batches = make_batches(9, seed=27)
    failing = _Restored(rig, "checkpointing" in implementation.features, "hooks" in implementation.features)
    for batch_idx, batch in enumerate(batches):
        with rig.context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            failing.batch(batch_idx, batch)
            rig.wrappers["b"].step(rig.closure("b", batch))
            closes, outcome = batch_idx % 3 == 2, rig.wrappers["a"].last_outcome
            assert outcome is (S if closes else A), f"batch {batch_idx}: wrapper a's last_outcome {outcome}"
    windows = [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
    plans: dict[str, tuple[torch.optim.Optimizer, Sequence[Sequence[int]]]] = {
        "a": (torch.optim.SGD(rig.oracle.a.parameters(), lr=SGD_LR, momentum=0.9), windows),
        "b": (torch.optim.SGD(rig.oracle.b.parameters(), lr=SGD_LR), windows),
    }
    _oracle_run(cell, rig.oracle, batches, plans, accumulate=3, in_batch=True, clip=CLIP)
    assert_params_close(rig.model, rig.oracle, cell, "three clipped windows after failed calls, restored")


# -- FAIL-006: states and copies carry the policy ------------------------------------------------------------


def _policy_training(make_context: MakeContext, policy: str) -> tuple[TrainingContext, torch.nn.Module, Any]:
    """A context of ``on_failure=policy`` (``accumulate_grad_batches=3``), its model and one SGD wrapper."""
    context = make_context(accumulate_grad_batches=3, **failure_settings(policy))
    model = context.prepare_module(make_model(seed=5))
    return context, model, context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))


def _policy_micro_step(
    context: TrainingContext, model: torch.nn.Module, wrapper: Any, batch: Batch, cell: Cell, **kw: Any
) -> None:
    """One ``step(closure)`` on ``batch``, with the keywords ``kw``."""

    def closure() -> None:
        with context.autocast():
            wrapper.backward(mse(model, batch, cell_device(cell), cell_dtype(cell)) * LOSS_FACTOR)

    wrapper.step(closure, **kw)


def _saved(context: TrainingContext) -> dict[str, Any]:
    """The context's state as a checkpoint carries it: through ``torch.save`` and ``torch.load(weights_only=True)``."""
    buffer = io.BytesIO()
    torch.save(context.state_dict(), buffer)
    state: dict[str, Any] = torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)
    return state


def _assert_refused_by_the_other_policy(
    make_context: MakeContext, cell: Cell, batch: Batch, state: dict[str, Any], taken: str, other: str
) -> None:
    """A context of policy ``other``, its window open, refuses ``state``: its state, window and outcome unchanged."""
    refusing, refusing_model, refusing_wrapper = _policy_training(make_context, other)
    _policy_micro_step(refusing, refusing_model, refusing_wrapper, batch, cell)
    before_state = copy.deepcopy(refusing.state_dict())
    held = grads(list(refusing_model.parameters()))
    with refuses(
        ValueError,
        f"load_state_dict of a {taken} into an on_failure={other!r} context",
        "FAIL-006, CKPT-003: a state of the other failure policy is refused before anything changes",
    ):
        refusing.load_state_dict(copy.deepcopy(state))
    what = f"after the refused load of a {taken}"
    assert_same_state(refusing.state_dict(), before_state, f"{what}, context.state_dict()")
    assert_same_grads(grads(list(refusing_model.parameters())), held, what)
    assert refusing_wrapper.last_outcome is A, f"{what}: last_outcome {refusing_wrapper.last_outcome}"
    assert refusing.on_failure == other, f"{what}: on_failure reads {refusing.on_failure!r}"


def _assert_a_copy_keeps_the_policy(
    whole: tuple[TrainingContext, torch.nn.Module, Any], how: str, policy: str, batch: Batch, cell: Cell
) -> None:
    """A ``pickle`` or ``deepcopy`` of the training state reads ``policy`` and acts on it; the original untouched."""
    _, model, _ = whole
    clone = pickle.loads(pickle.dumps(whole)) if how == "pickle" else copy.deepcopy(whole)
    clone_context, clone_model, clone_wrapper = clone
    assert clone_context.on_failure == policy, (
        f"a {how} of an on_failure={policy!r} context reads {clone_context.on_failure!r} (FAIL-006)"
    )
    original = grads(list(model.parameters()))
    window = grads(list(clone_model.parameters()))

    def failing() -> None:
        with clone_context.autocast():
            loss = mse(clone_model, batch, cell_device(cell), cell_dtype(cell)) * LOSS_FACTOR
        clone_wrapper.backward(loss)
        raise PlannedFailure("the closure fails after its backward")

    call = f"a failed call on a {how} of an on_failure={policy!r} training state"
    with refuses(PlannedFailure, call, "CLOS-003: the closure's exception propagates"):
        clone_wrapper.step(failing)
    want: list[torch.Tensor | None] = [None] * len(window) if policy == "discard" else window
    assert_same_grads(grads(list(clone_model.parameters())), want, f"{call} (FAIL-006: the copy's policy)")
    assert_same_grads(grads(list(model.parameters())), original, f"{call}: the original's window")


@pytest.mark.requirement("FAIL-006", "CKPT-003", "PICKLE-001", "FAIL-003", "FAIL-004")
@pytest.mark.features("checkpointing", "exact_restore")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed"))
@pytest.mark.varies(
    on_failure=("discard", "restore"),
    copies=("checkpoint", "pickle", "deepcopy"),
    faults=("refused load", "raising closure after its backward"),
    window=("1 micro-step", "k >= 2 micro-steps"),
)
def test_states_and_copies_carry_the_failure_policy(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any]
) -> None:
    """A context's state loads only into a context of its policy; a copy keeps its policy, and acts on it.

    For each policy, a state taken with a window open and one taken with none (each through ``torch.save`` and
    ``torch.load(weights_only=True)``, as checkpoints travel) load into a fresh context of the same policy; a
    context of the other policy refuses both with ``ValueError``, its state, window and outcome unchanged. Where
    pickling is claimed, a ``pickle`` and a ``deepcopy`` of the whole training state read the same ``on_failure``,
    and a failed call on the copy discards its window (``"discard"``) or leaves it as it was (``"restore"``), the
    original untouched.
    """
    batches = make_batches(3, seed=29)
    pickling = "pickling" in implementation.features
    for policy, other in (("discard", "restore"), ("restore", "discard")):
        context, model, wrapper = _policy_training(make_context, policy)
        _policy_micro_step(context, model, wrapper, batches[0], cell)
        open_state = _saved(context)
        _policy_micro_step(context, model, wrapper, batches[1], cell, make_optimizer_step=True)
        closed_state = _saved(context)
        _policy_micro_step(context, model, wrapper, batches[2], cell)
        for taken, state in (("with a window open", open_state), ("with no window open", closed_state)):
            fresh, _, _ = _policy_training(make_context, policy)
            fresh.load_state_dict(copy.deepcopy(state))
            assert fresh.on_failure == policy, f"a {policy!r} context reads {fresh.on_failure!r} after a load"
            _assert_refused_by_the_other_policy(
                make_context, cell, batches[1], state, f"{policy!r} state taken {taken}", other
            )
        if pickling:
            for how in ("pickle", "deepcopy"):
                _assert_a_copy_keeps_the_policy((context, model, wrapper), how, policy, batches[1], cell)
