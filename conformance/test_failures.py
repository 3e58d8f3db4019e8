"""Checks of the failure policy (FAIL-001 to FAIL-007): what a call that raises leaves behind.

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
import math
import pickle
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from typing import Any, NoReturn

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import assert_unchanged, snapshot, state_diff
from lightning_optimizer.conformance.checkpointing import through_a_checkpoint
from lightning_optimizer.conformance.failure_rigs import (
    EAGER,
    GROWING,
    KINDS,
    SGD_LR,
    FailurePlan,
    Kind,
    Rig,
    run_epoch,
)
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    FlakySGD,
    PlannedFailure,
    assert_discard_note,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    refuses,
)
from lightning_optimizer.conformance.zeroing_rig import ZeroRig
from lightning_optimizer.spec import Cell, GradScalerSettings, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, D = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.DISCARDED


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


def _raise(message: str) -> NoReturn:
    raise PlannedFailure(message)


_BEFORE_ANY_BACKWARD: list[tuple[str, Callable[[Rig, int], object], type[BaseException]]] = [
    ("a closure that raises at once", lambda rig, i: _raise("the closure fails at once"), PlannedFailure),
    (
        "a closure that raises after its forward pass",
        lambda rig, i: (rig.loss("a", i), _raise("the closure fails after its forward pass")),
        PlannedFailure,
    ),
    (
        "a closure that raises after zero_grad() of both wrappers",
        lambda rig, i: (
            rig.wrappers["a"].zero_grad(),
            rig.wrappers["b"].zero_grad(set_to_none=False),
            rig.loss("a", i),
            _raise("the closure fails after zero_grad() of both wrappers (both windows open: no-ops)"),
        ),
        PlannedFailure,
    ),
    (
        "a closure that raises after torch.autograd.grad",
        lambda rig, i: (
            torch.autograd.grad(rig.loss("a", i), list(rig.halves["a"].parameters())),
            _raise("the closure fails after torch.autograd.grad, which writes no .grad"),
        ),
        PlannedFailure,
    ),
    (
        "a closure whose wrapper.backward wrote no gradient of the window",
        lambda rig, i: (
            rig.wrappers["a"].backward(
                torch.zeros(3, device=cell_device(rig.cell), dtype=cell_dtype(rig.cell), requires_grad=True).sum()
            ),
            _raise("the closure fails after a backward that wrote no gradient of the window"),
        ),
        PlannedFailure,
    ),
    (
        "a closure that re-enters step()",
        lambda rig, i: (rig.loss("a", i), rig.wrappers["b"].step(rig.closure("b", i))),
        RuntimeError,
    ),
    (
        "a closure whose backward's before_backward hook raises",
        lambda rig, i: rig.wrappers["a"].backward(rig.loss("a", i)),
        PlannedFailure,
    ),
]
"""Wrapper ``a``'s closures (given the rig and the batch) that fail before any backward writes into its window, and
what they raise; the last fails in a ``before_backward`` hook (registered only where hooks are claimed)."""


def _fail_before_any_backward(rig: Rig, on_failure: str, state: bool, hooks: bool) -> None:
    """With both windows open, wrapper ``a``'s calls that fail before any backward wrote, then after one wrote."""
    a = rig.wrappers["a"]
    bad: list[tuple[str, dict[str, Any]]] = [
        ("closure=3", {"closure": 3}),
        ("make_optimizer_step='yes'", {"closure": rig.closure("a", 1), "make_optimizer_step": "yes"}),
    ]
    for make_step in (False, True):
        for what, closure, raised in _BEFORE_ANY_BACKWARD[: 7 if hooks else 6]:
            call = f"wrapper a's step(make_optimizer_step={make_step}) with {what} (on_failure={on_failure!r})"
            why = "FAIL-002: the exception of a call that fails before any backward wrote propagates"
            with rig.hook_raises("before_backward") if "hook" in what else nullcontext():
                rig.fails(call, why, partial(a.step, partial(closure, rig, 1), make_step), raised=raised, state=state)
        for what, arguments in bad:
            why = "ERR-001, ERR-002: a bad argument is refused with TypeError before anything runs"
            rig.fails(f"wrapper a's step({what}) (FAIL-002)", why, partial(a.step, **arguments), raised=TypeError)
    call = f"wrapper a's step() whose closure raises after loss.backward() (on_failure={on_failure!r})"
    plain = partial(a.step, rig.closure("a", 1, plain=True, fail=True), make_optimizer_step=False)
    discarded = "a" if on_failure == "discard" else None
    rig.fails(call, "CLOS-003: the closure's exception propagates", plain, discarded=discarded, held=1, state=state)


def _fail_on_a_prepared_window(rig: Rig, on_failure: str) -> None:
    """A prepared window: closing steps failing before any backward, and refused calls, change nothing [CLIP-002]."""
    a = rig.wrappers["a"]
    a.backward(rig.loss("a", 2))
    a.unscale_gradients()
    refused_backward = ("a closure whose backward is refused", _BEFORE_ANY_BACKWARD[-1][1], RuntimeError)
    for what, closure, raised in (_BEFORE_ANY_BACKWARD[1], refused_backward):
        for closing in (None, True):
            call = (
                f"wrapper a's closing step(make_optimizer_step={closing}) of a window unscale_gradients() "
                f"prepared, with {what} (on_failure={on_failure!r})"
            )
            failing = partial(a.step, partial(closure, rig, 2), make_optimizer_step=closing)
            rig.fails(call, "FAIL-002: the closure's exception propagates", failing, raised=raised)
    for what, refused in (
        ("step(make_optimizer_step=False)", partial(a.step, make_optimizer_step=False)),
        ("zero_grad()", a.zero_grad),
    ):
        call = f"wrapper a's {what} after unscale_gradients(), before the closing step()"
        why = "CLIP-002: a stage that forbids the call refuses it, changing nothing (FAIL-002)"
        rig.fails(call, why, refused, raised=RuntimeError)


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
    rig = Rig(make_context, cell, make_batches(3, seed=21), accumulate_grad_batches=3, **failure_settings(on_failure))
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    rig.batch(0, "a", "b")
    with rig.context.batch(1):
        features = implementation.features
        _fail_before_any_backward(rig, on_failure, "checkpointing" in features, "hooks" in features)
        rig.call("a", 1)
        rig.call("b", 1)
    with rig.context.batch(2):
        _fail_on_a_prepared_window(rig, on_failure)
        a.step()
        rig.call("b", 2)
    assert a.last_outcome is S and b.last_outcome is S, (
        f"after the failed and refused calls the windows did not close on time: {a.last_outcome}, {b.last_outcome}"
    )
    a_window = (1, 2) if discard else (0, 1, 2)
    rig.train_oracle({"a": [a_window], "b": [(0, 1, 2)]})
    rig.assert_oracle(f"the windows {a_window} and (0, 1, 2) ({on_failure})")


# -- FAIL-003: a discarded window ---------------------------------------------------------------------------

_DISCARDS = {
    "closure-after-backward-2-wrappers": FailurePlan(
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
    "plain-backward-cut-short": FailurePlan(
        4, "Adam", "plain", "closure", 7, 3, 3, ((3,), (4, 5, 6)), (A, A, A, S, A, A, S), schedule={3: True}
    ),
    "inner-step-outside-batch-skipped": FailurePlan(
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
    "hook-flushed": FailurePlan(
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
    "prepared-then-accumulated": FailurePlan(
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
    "prepared-in-closure-same-iteration": FailurePlan(
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
    "closure-after-backward-outside-batch": FailurePlan(
        3, "SGD", "closure", "closure", 5, 2, 2, ((2, 3, 4),), (A, A, A, A, S), in_batch=False
    ),
}
"""Under the default policy: ``a``'s windows by hand (the discarded one is gone, the next starts at the retry)."""


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
    kinds = (plan.kind,) if plan.other is None else (plan.kind, "SGD")
    batches = make_batches(plan.batches, seed=23)
    rig = Rig(make_context, cell, batches, kinds, accumulate_grad_batches=plan.accumulate)
    outcomes = run_epoch(rig, plan, f"{scenario}: wrapper a's failed call in batch {plan.failing}")
    assert outcomes == list(plan.outcomes), (
        f"{scenario}: wrapper a's last_outcome after each batch {outcomes}, expected {list(plan.outcomes)} (the "
        f"windows {plan.windows}: the discarded window's length is 0, the next counts from its first micro-step)"
    )
    rig.train_oracle({"a": plan.windows, "b": plan.other_windows}, in_batch=plan.in_batch)
    rig.assert_oracle(f"{scenario}: after a discarded window, the windows {plan.windows}")


# -- FAIL-003, FAIL-004: the loss scaler's record of a failed window -----------------------------------------


def _b_fails_after_unscaling(rig: Rig, failing: str, on_failure: str) -> bool:
    """Wrapper ``b``'s closing call of batch 1 fails after its window was unscaled; whether it then stepped."""
    b, discarded = rig.wrappers["b"], "b" if on_failure == "discard" else None
    if failing == "closure":

        def overflowing() -> None:
            b.backward(rig.loss("b", 1, record=False) * math.inf)
            b.unscale_gradients()
            raise PlannedFailure("the closure fails after unscaling an overflowing window")

        call = f"wrapper b's closing step() whose closure unscaled an overflow, then raised ({on_failure})"
        rig.fails(
            call, "CLOS-003: the closure's exception propagates", partial(b.step, overflowing), discarded=discarded
        )
        return False
    b.backward(rig.loss("b", 1))
    b.unscale_gradients()
    call = "wrapper b's closing step() of a window unscale_gradients() prepared, its inner step raising"
    with rig.inner_fails("b"):
        why = "TXN-001: the inner step's exception propagates"
        rig.fails(call, why, partial(b.step, make_optimizer_step=True), discarded=discarded)
    if discarded is None:
        b.step(make_optimizer_step=True)  # the prepared window is back: its step applies it
        assert rig.wrappers["a"].last_outcome is S and b.last_outcome is S, f"batch 1: {b.last_outcome} after the retry"
    return discarded is None


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
    rig = Rig(make_context, cell, make_batches(3, seed=25), grad_scaler=GROWING, **failure_settings(on_failure))
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    for batch_idx in range(3):
        with rig.context.batch(batch_idx, is_last=batch_idx == 2):
            rig.call("a", batch_idx)
            if batch_idx == 1 and _b_fails_after_unscaling(rig, failing, on_failure):
                continue
            rig.call("b", batch_idx)
            assert a.last_outcome is S and b.last_outcome is S, f"batch {batch_idx}: {a.last_outcome}, {b.last_outcome}"
    windows = [(0,), (1,), (2,)]
    want, _ = rig.train_oracle({"a": windows, "b": windows})
    assert want == [2.0**10] * 2 + [2.0**11] * 2 + [2.0**12] * 2, f"the plain loop's scales {want}"
    if failing == "inner-step" and on_failure == "discard":
        want = [*want[:3], want[3], *want[3:]]  # b's failed attempt backpropagated at batch 1's scale too
    scales = [scale for _, scale in rig.scales]
    assert scales == want, (
        f"the backward passes were scaled by {scales}, the plain loop's by {want}: the failed window's overflow, "
        "which the loss scaler recorded when it was unscaled, was not forgotten (FAIL-003, FAIL-004)"
    )
    rig.assert_oracle(f"after the failed overflowing window ({on_failure})")


# -- FAIL-007: unscale_gradients() between calls fails as a call does -------------------------------------------


@contextmanager
def _unscale_fails(when: str, fired: list[str]) -> Iterator[None]:
    """In the block, ``torch.amp.GradScaler.unscale_`` raises :class:`PlannedFailure` once (AMP-001: the scaler).

    ``when``: ``"before"`` it unscales (nothing recorded, the gradients as the preparation left them so far), or
    ``"after"`` (the gradients unscaled in place and the scaler's record of the optimizer written).
    """
    original = GradScaler.unscale_

    def failing(scaler: GradScaler, optimizer: torch.optim.Optimizer) -> None:
        GradScaler.unscale_ = original  # type: ignore[method-assign]  # once
        fired.append(when)
        if when == "after":
            original(scaler, optimizer)
        raise PlannedFailure(f"the loss scaler's unscale_ fails {when} unscaling (planted by the check)")

    GradScaler.unscale_ = failing  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        GradScaler.unscale_ = original  # type: ignore[method-assign]


_POLICY_RETRIES = (
    pytest.param("discard", "none", id="discard-next-batch"),
    pytest.param("discard", "same-batch", id="discard-new-window-now"),
    pytest.param("restore", "unscale-again", id="restore-unscale-again", marks=pytest.mark.features("exact_restore")),
    pytest.param("restore", "step", id="restore-step", marks=pytest.mark.features("exact_restore")),
)
"""Each policy with what follows the failure. ``"discard"``: the next window starts at the next batch, or at once (a
backward and the closing step in the same batch: the iteration's scaler record of the optimizer must be gone).
``"restore"``: ``unscale_gradients()`` again (its gradients inspected) then the closing ``step()``, or that ``step()``
alone."""


class _TwoGroups:
    """An optimizer whose first parameter is in a group of its own, the others in a second with half the rate."""

    def __init__(self, params: Any, **hyper: Any) -> None:
        params = list(params)
        second = {"params": params[1:], "lr": hyper["lr"] / 2}
        super().__init__([{"params": params[:1]}, second], **hyper)  # type: ignore[call-arg]


class _TwoGroupFlakySGD(_TwoGroups, FlakySGD):
    """The flaky SGD in two parameter groups."""


class _TwoGroupSGD(_TwoGroups, torch.optim.SGD):
    """The oracle's SGD in the same two groups."""


_GROUPS: dict[int, Kind] = {1: KINDS["SGD"], 2: (_TwoGroupFlakySGD, _TwoGroupSGD, {"lr": SGD_LR})}


def _prepared(
    window: list[torch.Tensor | None], scale: float, divisor: int, length: int, clip: float | None
) -> list[torch.Tensor | None]:
    """The window's gradients as its preparation leaves them, worked from its summed, scaled ones by hand.

    Each micro-step's loss was divided by ``divisor`` and multiplied by ``scale``: the mean is the sum times
    ``divisor / length``, unscaled by ``1 / scale``; then clipped by total norm to ``clip`` as ``clip_grad_norm_`` does.
    """
    mean = [None if grad is None else grad.double() * divisor / (length * scale) for grad in window]
    if clip is not None:
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in mean if g is not None]))
        factor = min(1.0, clip / (float(norm) + 1e-6))
        mean = [None if grad is None else grad * factor for grad in mean]
    return mean


@pytest.mark.requirement("FAIL-007", "FAIL-003", "FAIL-004", "CLIP-002", "AMP-002", "ACC-001")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.parametrize(("on_failure", "retry"), _POLICY_RETRIES)
@pytest.mark.parametrize("held", [0, 1, 3], ids=["window-of-1", "cut-short-2", "full-4"])
@pytest.mark.parametrize("when", ["before", "after"], ids=["fails-before-unscaling", "fails-after-unscaling"])
@pytest.mark.parametrize("clip", [None, 2e-4], ids=["no-clip", "clip-norm"])
@pytest.mark.parametrize("groups", [1, 2], ids=["1-group", "2-groups"])
@pytest.mark.varies(
    on_failure=("discard", "restore"),
    faults=("loss scaler's unscale_ raising before unscaling", "loss scaler's unscale_ raising after unscaling"),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "open while another optimizer steps"),
    clipping=("norm", "unscale_gradients() by hand"),
    loss_scale=("settings given to the factory",),
    wrappers=("2",),
    param_groups=("1", "2 with other hyper-parameters"),
    position=("inside batch()",),
    call_form=("closure, wrapper.backward", "backward, then step()"),
)
def test_a_failed_unscale_gradients_follows_the_policy(
    make_context: MakeContext,
    cell: Cell,
    on_failure: str,
    retry: str,
    held: int,
    when: str,
    clip: float | None,
    groups: int,
) -> None:
    """16-mixed, ``accumulate_grad_batches=4``: ``unscale_gradients()`` fails halfway through the preparation.

    Wrapper ``a`` accumulates ``held`` micro-steps, backpropagates its closing micro-step and calls
    ``unscale_gradients()``, whose loss scaler raises (before it unscales, or after). The preparation has begun (the
    window's mean of a window cut short is written in place first), so under ``"discard"`` the window is discarded
    (FAIL-003) and the next one is exact, also when it starts in the same iteration; under ``"restore"`` it is
    exactly as before the call, not prepared, and a retried ``unscale_gradients()`` leaves the window's mean,
    unscaled once and clipped (worked by hand from the gradients before the failure), which the closing ``step()``
    applies [FAIL-007]. Wrapper ``b`` accumulates windows of 2 micro-steps (one is open when ``a`` fails after an odd
    number of batches); its windows are never touched. The scale stays (``growth_interval`` is torch's): the plain
    loop does not rescale open windows.
    """
    settings: dict[str, Any] = {"accumulate_grad_batches": 4, **failure_settings(on_failure)}
    if clip is not None:
        settings["gradient_clip_val"] = clip
    batches, scale = held + 3, 2.0**10
    rig = Rig(
        make_context,
        cell,
        make_batches(batches, seed=71 + held),
        kinds=(_GROUPS[groups], "SGD"),
        grad_scaler=GradScalerSettings(init_scale=scale),
        **settings,
    )
    a = rig.wrappers["a"]
    discard = on_failure == "discard"
    fired: list[str] = []
    for batch_idx in range(batches):
        with rig.context.batch(batch_idx, is_last=batch_idx == batches - 1):
            if batch_idx < held:
                rig.call("a", batch_idx)  # the schedule accumulates (the window is closed early below)
            elif batch_idx == held:
                a.backward(rig.loss("a", batch_idx))
                window = [None if p.grad is None else p.grad.clone() for p in rig.halves["a"].parameters()]
                what = f"a.unscale_gradients() of a window of {held + 1} micro-step(s), unscale_ failing {when}"
                with _unscale_fails(when, fired):
                    rig.fails(
                        what,
                        "FAIL-007: the preparation's exception propagates",
                        a.unscale_gradients,
                        discarded="a" if discard else None,
                        held=held,
                    )
                assert fired == [when], (
                    f"{what}: torch.amp.GradScaler.unscale_ was not called with the window's optimizer, so the "
                    "planted fault never fired (AMP-001, AMP-002: the scaler unscales the window)"
                )
                if retry == "unscale-again":
                    a.unscale_gradients()
                    want = _prepared(window, scale, 4, held + 1, clip)
                    for index, (param, grad) in enumerate(zip(rig.halves["a"].parameters(), want, strict=True)):
                        ok = (
                            grad is None
                            if param.grad is None
                            else grad is not None and torch.allclose(param.grad.double(), grad, rtol=1e-4, atol=1e-9)
                        )
                        assert ok, (
                            f"after {what} (restore), a second unscale_gradients() left parameter {index}'s gradient "
                            "other than the window's mean, unscaled once and clipped (FAIL-007, CLIP-002)"
                        )
                if retry == "same-batch":
                    a.backward(rig.loss("a", batch_idx))  # a new window, closed in the same iteration
                if retry != "none":
                    a.step(make_optimizer_step=True)
                    assert a.last_outcome is S, f"{what}: the step after it gave {a.last_outcome}, expected {S}"
            else:
                rig.call("a", batch_idx)  # the next window, closed by the schedule or the epoch's last batch
            rig.call("b", batch_idx, make_step=batch_idx % 2 == 1 or batch_idx == batches - 1)
    first = [] if retry == "none" else [(held,)] if discard else [tuple(range(held + 1))]
    b_windows = [tuple(range(i, min(i + 2, batches))) for i in range(0, batches, 2)]
    rig.train_oracle({"a": [*first, tuple(range(held + 1, batches))], "b": b_windows})
    rig.assert_oracle(
        f"after a.unscale_gradients() failed {when} unscaling a window of {held + 1} ({on_failure}, then {retry})"
    )


@pytest.mark.requirement("FAIL-007", "ZERO-007", "ZERO-005", "FAIL-003", "FAIL-004")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.parametrize("when", ["before", "after"], ids=["fails-before-unscaling", "fails-after-unscaling"])
@pytest.mark.varies(
    on_failure=("discard", "restore"),
    faults=("loss scaler's unscale_ raising before unscaling", "loss scaler's unscale_ raising after unscaling"),
    zero_grad_after_step=("False",),
    window=("carrying the last step's gradients", "k >= 2 micro-steps"),
    param_groups=("2 with other hyper-parameters",),
    wrappers=("2",),
    clipping=("unscale_gradients() by hand",),
)
def test_a_failed_unscale_gradients_of_a_carrying_window(
    make_context: MakeContext, cell: Cell, on_failure: str, when: str
) -> None:
    """``zero_grad_after_step=False``: a window that carries the last step's gradients fails in ``unscale_gradients()``.

    Under ``"discard"`` the carried part goes with the window (ZERO-007): the new window, stepped in the same
    iteration, applies its own mean alone; under ``"restore"`` the window is back with its carried part, and the
    closing step applies both [FAIL-007]. Every step against the plain loop that leaves zeroing to the user.
    """
    rig = ZeroRig(
        make_context,
        cell,
        zero_grad_after_step=False,
        accumulate=2,
        grad_scaler=GradScalerSettings(init_scale=2.0**10),
        on_failure=on_failure,  # type: ignore[arg-type]
    )
    a = rig.wrappers["a"]
    with rig.batch(0):
        rig.step("a", 0, True)  # a taken step: its gradients are left for the next window to carry
        rig.step("b", 0, True)
    with rig.batch(1):
        rig.step("a", 1, False)  # the window's first micro-step takes them
        rig.step("b", 1, False)
    with rig.batch(2):
        rig.plain.backward("a", rig.plain_loss("a", 2))
        a.backward(rig.loss("a", 2))
        fired: list[str] = []
        what = f"a.unscale_gradients() of a window carrying the last step's gradients, unscale_ failing {when}"
        with _unscale_fails(when, fired), refuses(PlannedFailure, what, "FAIL-007: the exception propagates"):
            a.unscale_gradients()
        assert fired == [when], f"{what}: torch.amp.GradScaler.unscale_ was not called (AMP-001, AMP-002)"
        if on_failure == "discard":
            rig.plain.discard("a")
            rig.step("a", 2, True)  # a new window of one micro-step, closed in the same iteration
        else:
            a.step(make_optimizer_step=True)
            rig.after_call("a", True, f"the closing step() after {what}")
        rig.step("b", 2, True)
    rig.assert_params(f"after {what} ({on_failure})")


# -- FAIL-004: restore returns to the last successful call ---------------------------------------------------

CLIP = 2e-4
"""A norm the windows' gradients exceed: the preparation of a real step changes them in place."""


def _fail_and_restore(rig: Rig, i: int, state: bool, hooks: bool) -> None:
    """Batch ``i``'s failures of wrapper ``a``, each leaving everything as it was [FAIL-004], then its call."""
    a, why = rig.wrappers["a"], "CLOS-003, TXN-001, HOOK-004: the failure propagates"
    after_backward = partial(a.step, rig.closure("a", i, fail=True))

    def expect(what: str, failing: Callable[[], object], planted: Any = None, prepared: bool = False) -> None:
        with planted or nullcontext():
            rig.fails(f"batch {i}: {what}: under on_failure='restore'", why, failing, state=state and not prepared)

    if i in (0, 1, 3, 6, 7):
        expect("a closure that raises after its backward", after_backward)
    if i == 1:
        cut_short = partial(a.step, rig.closure("a", i), make_optimizer_step=True)
        expect("a step cut short whose inner step raises", cut_short, rig.inner_fails())
    if i == 2 and hooks:
        hook = rig.hook_raises("before_optimizer_step")
        expect("a closing step whose before_optimizer_step hook raises", partial(a.step, rig.closure("a", i)), hook)
    if i == 7:
        a.zero_grad(set_to_none=False)  # a window is open: nothing happens [ZERO-002]
        expect("again, after zero_grad(set_to_none=False)", after_backward)
    if i in (4, 8):
        a.backward(rig.loss("a", i))
    if i == 4:
        cut_short = partial(a.step, make_optimizer_step=True)
        expect("a step() cut short after its backward, whose inner step raises", cut_short, rig.inner_fails())
    if i == 8:
        a.unscale_gradients()
        expect("the closing step() of a prepared window, whose inner step raises", a.step, rig.inner_fails(), True)
        call = "wrapper a's zero_grad() after unscale_gradients() and a failed closing step()"
        why = "CLIP-002, FAIL-004: the restored window is still prepared; zero_grad() is refused"
        rig.fails(call, why, a.zero_grad, raised=RuntimeError)
    a.step() if i in (4, 8) else rig.call("a", i)


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
    batches = make_batches(9, seed=27)
    settings: dict[str, Any] = {"accumulate_grad_batches": 3, "gradient_clip_val": CLIP, "on_failure": "restore"}
    rig = Rig(make_context, cell, batches, ("SGD momentum", "SGD"), **settings)
    features = implementation.features
    for batch_idx in range(len(batches)):
        with rig.context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            _fail_and_restore(rig, batch_idx, "checkpointing" in features, "hooks" in features)
            rig.call("b", batch_idx)
            closes, outcome = batch_idx % 3 == 2, rig.wrappers["a"].last_outcome
            assert outcome is (S if closes else A), f"batch {batch_idx}: wrapper a's last_outcome {outcome}"
    windows = [(0, 1, 2), (3, 4, 5), (6, 7, 8)]
    rig.train_oracle({"a": windows, "b": windows})
    rig.assert_oracle("three clipped windows after failed calls, restored")


# -- FAIL-006: states and copies carry the policy ------------------------------------------------------------


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

    def rig_of(policy: str) -> Rig:
        return Rig(make_context, cell, batches, ("SGD",), accumulate_grad_batches=3, **failure_settings(policy))

    for policy, other in (("discard", "restore"), ("restore", "discard")):
        rig = rig_of(policy)
        rig.call("a", 0)
        open_state = through_a_checkpoint(rig.context.state_dict())
        rig.call("a", 1, True)
        closed_state = through_a_checkpoint(rig.context.state_dict())
        rig.call("a", 2)
        for taken, state in (("with a window open", open_state), ("with no window open", closed_state)):
            fresh = rig_of(policy)
            fresh.context.load_state_dict(copy.deepcopy(state))
            assert fresh.context.on_failure == policy, f"a {policy!r} context reads {fresh.context.on_failure!r}"
            refusing = rig_of(other)
            refusing.call("a", 1)
            call = f"load_state_dict of a {policy!r} state taken {taken} into an on_failure={other!r} context"
            why = "FAIL-006, CKPT-003: a state of the other failure policy is refused before anything changes"
            load = partial(refusing.context.load_state_dict, copy.deepcopy(state))
            refusing.fails(call, why, load, raised=ValueError, state=True)
            assert refusing.context.on_failure == other, f"{call}: on_failure reads {refusing.context.on_failure!r}"
        for how in ("pickle", "deepcopy") if "pickling" in implementation.features else ():
            clone = pickle.loads(pickle.dumps(rig)) if how == "pickle" else copy.deepcopy(rig)
            assert clone.context.on_failure == policy, (
                f"a {how} of an on_failure={policy!r} context reads {clone.context.on_failure!r} (FAIL-006)"
            )
            call = f"a failed call on a {how} of an on_failure={policy!r} training state (FAIL-006: the copy's policy)"
            original = snapshot(rig.model)
            failing = partial(clone.wrappers["a"].step, clone.closure("a", 1, fail=True))
            discarded = "a" if policy == "discard" else None
            clone.fails(call, "CLOS-003: the closure's exception propagates", failing, discarded=discarded)
            assert_unchanged(rig.model, original, f"{call}: the original's window")


# -- FAIL-008: a backward outside step(), add_param_group and load_state_dict -----------------------------------


@contextmanager
def _backward_fails(rig: Rig, when: str, reached: tuple[str, ...], loss: torch.Tensor) -> Iterator[None]:
    """The backward of ``loss`` raises :class:`PlannedFailure`, before autograd wrote or after.

    From a hook on the loss, before autograd writes any gradient, or once every parameter of the halves ``reached``
    has had its gradient accumulated.
    """
    handles: list[Any] = []
    if when == "before":

        def on_loss(grad: torch.Tensor) -> NoReturn:
            raise PlannedFailure("a hook on the loss fails before autograd writes any gradient")

        handles.append(loss.register_hook(on_loss))
    else:
        params = [p for name in reached for p in rig.halves[name].parameters()]
        written: list[int] = []

        def on_param(param: torch.Tensor) -> None:
            written.append(1)
            if len(written) == len(params):
                raise PlannedFailure("a hook fails once autograd has written every gradient")

        handles += [param.register_post_accumulate_grad_hook(on_param) for param in params]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


BATCHES_8 = 8
"""Batches in the epochs of the FAIL-008 checks."""

_BACKWARD_CASES = [("before", ("a",), 1), ("after", ("a",), 1), ("after", ("a",), 2), ("after", ("a", "b"), 1)]
_BACKWARD_CASES += [("before", ("a", "b"), 2), ("after", ("a", "b"), 2)]


@pytest.mark.requirement("FAIL-008", "FAIL-002", "FAIL-003", "FAIL-004", "ACC-001")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed", "bf16-mixed"))
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.parametrize(
    ("when", "reached", "held"),
    _BACKWARD_CASES,
    ids=[f"fails-{w}-writing-{'+'.join(r)}-{h}-held" for w, r, h in _BACKWARD_CASES],
)
@pytest.mark.varies(
    faults=("hook raising before autograd wrote", "hook raising after autograd wrote"),
    call_form=("backward, then step()",),
    on_failure=("discard", "restore"),
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    wrappers=("2",),
    optimizer=("SGD", "Adam"),
    recovery=("retried",),
)
def test_a_failed_backward_outside_step_follows_the_policy(
    make_context: MakeContext, cell: Cell, on_failure: str, when: str, reached: tuple[str, ...], held: int
) -> None:
    """``a.backward(loss)`` outside ``step()`` (the direct form) fails, its loss reaching ``a``'s half or both.

    Failing before autograd wrote anything it changes nothing (FAIL-002). Failing after, under ``"discard"`` the
    windows it wrote into are discarded (every gradient ``None``, ``DISCARDED``, the note naming the optimizer), the
    other untouched; under ``"restore"`` both windows are exactly as before [FAIL-008]. The backward is then made again
    and the loop goes on; every step against the plain loop over the windows left. ``a`` is SGD and ``b`` Adam, which
    the notes tell apart; ``b`` closes a window every second batch.
    """
    rig = Rig(
        make_context,
        cell,
        make_batches(BATCHES_8, seed=120 + held),
        kinds=("SGD", "Adam"),
        accumulate_grad_batches=4,
        **failure_settings(on_failure),
    )
    a = rig.wrappers["a"]
    discards = on_failure == "discard" and when == "after"
    lost = reached if discards else ()
    a_closes = {held + 1, BATCHES_8 - 1}
    what = f"a.backward(loss) outside step() with {held} micro-step(s) held, its loss reaching {'+'.join(reached)}, "
    what += f"failing {when} autograd wrote"
    for batch_idx in range(BATCHES_8):
        with rig.context.batch(batch_idx, is_last=batch_idx == BATCHES_8 - 1):
            if batch_idx == held:
                loss = sum((rig.loss(name, batch_idx, record=False) for name in reached), torch.zeros(()))
                why = "FAIL-008: the backward's exception propagates"
                with _backward_fails(rig, when, reached, loss):
                    if len(lost) == 2:
                        with refuses(PlannedFailure, what, why) as error:
                            a.backward(loss)
                        for name in lost:
                            gone = [p.grad for p in rig.halves[name].parameters()]
                            assert all(grad is None for grad in gone), (
                                f"{what}: wrapper {name}'s window, which the backward wrote into, was not discarded "
                                "(FAIL-008, FAIL-003: every gradient None)"
                            )
                            outcome = rig.wrappers[name].last_outcome
                            assert outcome is D, f"{what}: wrapper {name}'s last_outcome is {outcome}, expected {D}"
                            assert_discard_note(error.value, rig.inner[name], (held, held + 1), what)
                    else:
                        rig.fails(what, why, partial(a.backward, loss), discarded="a" if lost else None, held=held)
            a.backward(rig.loss("a", batch_idx))
            a.step(make_optimizer_step=batch_idx in a_closes)
            rig.call("b", batch_idx, make_step=batch_idx % 2 == 1)
    first = (held, held + 1) if "a" in lost else tuple(range(held + 2))
    b_windows: list[tuple[int, ...]] = [(i, i + 1) for i in range(0, BATCHES_8, 2)]
    if "b" in lost and held % 2 == 1:
        b_windows[held // 2] = (held,)
    rig.train_oracle({"a": [first, tuple(range(held + 2, BATCHES_8))], "b": b_windows})
    rig.assert_oracle(what)


@pytest.mark.requirement("FAIL-008", "ERR-005", "PROXY-003", "WIN-001")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed"))
@pytest.mark.parametrize("call", ["load_state_dict", "add_param_group"])
@pytest.mark.parametrize("kind", ["SGD momentum", "Adam"])
@pytest.mark.varies(
    faults=("raising load_state_dict", "raising add_param_group"),
    optimizer=("SGD momentum", "Adam"),
    window=("k >= 2 micro-steps", "1 micro-step"),
    recovery=("retried",),
    param_groups=("added after wrap",),
)
def test_a_failed_optimizer_change_leaves_the_optimizer(
    make_context: MakeContext, cell: Cell, call: str, kind: str
) -> None:
    """A wrapper's ``load_state_dict`` or ``add_param_group`` that fails halfway leaves the optimizer [FAIL-008].

    ``load_state_dict`` (a post-hook of the inner optimizer raising once the state is loaded) or ``add_param_group``
    (the inner optimizer raising once the group is appended) fails: the inner optimizer's ``state`` and
    ``param_groups`` are the same objects with the same entries, the window as it was; made again it works, and the
    loop goes on as the plain loop. ``load_state_dict`` runs with a window open, ``add_param_group`` between windows
    (with one open it is refused, WIN-001).
    """
    rig = Rig(make_context, cell, make_batches(6, seed=131), kinds=(kind,), accumulate_grad_batches=2)
    a, inner = rig.wrappers["a"], rig.inner["a"]
    extra = torch.nn.Parameter(torch.zeros(3, device=cell_device(rig.cell), dtype=cell_dtype(rig.cell)))
    for batch_idx in range(6):
        with rig.context.batch(batch_idx, is_last=batch_idx == 5):
            if batch_idx == (3 if call == "load_state_dict" else 2):
                saved = inner.state_dict()
                state, groups = inner.state, inner.param_groups
                entries = [dict(group) for group in groups]
                before = copy.deepcopy(saved)
                what = f"a.{call}(...) of a {kind} whose inner {call} raises after it changed the optimizer"
                fault = _failing_load(inner, saved) if call == "load_state_dict" else _failing_add(inner, extra)
                with fault as attempt:
                    rig.fails(what, "FAIL-008: the exception propagates", partial(getattr(a, call), attempt))
                assert inner.state is state and inner.param_groups is groups, (
                    f"{what}: the inner optimizer's state or param_groups is another object than before the call"
                )
                assert [dict(group) for group in inner.param_groups] == entries, (
                    f"{what}: the inner optimizer's groups are {inner.param_groups}, were {entries} (FAIL-008)"
                )
                problem = state_diff(inner.state_dict(), before)
                assert problem is None, f"{what}: the inner optimizer's state_dict changed: {problem}"
                if call == "load_state_dict":
                    a.load_state_dict(saved)
                else:
                    a.add_param_group({"params": [extra]})
                    assert any(p is extra for g in inner.param_groups for p in g["params"]), f"{what}, retried"
            rig.call("a", batch_idx)
    rig.train_oracle({"a": [(0, 1), (2, 3), (4, 5)]})
    rig.assert_oracle("a failed, then retried, change of the inner optimizer")


@contextmanager
def _failing_load(inner: torch.optim.Optimizer, saved: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The inner optimizer's ``load_state_dict`` raises from a post-hook, after it replaced state and groups."""

    def raising(optimizer: torch.optim.Optimizer) -> NoReturn:
        raise PlannedFailure("a load_state_dict post-hook fails after the state was loaded")

    attempt = copy.deepcopy(saved)
    attempt["param_groups"][0]["lr"] = 123.0  # loaded, then must be undone
    handle = inner.register_load_state_dict_post_hook(raising)
    try:
        yield attempt
    finally:
        handle.remove()


@contextmanager
def _failing_add(inner: torch.optim.Optimizer, extra: torch.Tensor) -> Iterator[dict[str, Any]]:
    """The inner optimizer's ``add_param_group`` raises after torch's appended the group."""

    def add_then_fail(param_group: dict[str, Any]) -> NoReturn:
        type(inner).add_param_group(inner, param_group)
        raise PlannedFailure("add_param_group fails after the group was appended")

    inner.add_param_group = add_then_fail  # type: ignore[method-assign]
    try:
        yield {"params": [extra]}
    finally:
        del inner.add_param_group
