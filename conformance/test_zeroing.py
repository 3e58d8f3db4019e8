"""Checks of what a real step leaves of its gradients (ZERO-003 to ZERO-007): the setting ``zero_grad_after_step``.

``True`` (the default): every real step clears the gradients it applied (ZERO-001). ``False`` (the feature
``"user_zero_grad"``, Lightning's automatic loop): a taken step leaves them until the user's ``zero_grad()``; the next
window takes them at its first micro-step and its real step applies them as they are plus the window's own mean,
clipped with it, never divided, unscaled, rescaled or reduced again. What was changed in place before it was taken is
refused; a failed window takes its carried part with it (or restores it); once taken it is the window's state.

Every expected value comes from a plain PyTorch loop beside the check (:class:`.zeroing_rig.PlainUserZeroGrad`: bare
optimizers, ``torch.autocast`` and, under 16-mixed, a plain ``torch.amp.GradScaler`` driven by hand with the carried
part kept aside and added after ``unscale_``), never from the implementation under test.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    assert_grads_close,
    assert_same_values,
    assert_unchanged,
    cloned,
    last_outcome,
    outcome_names,
    param_values,
    snapshot,
    state_diff,
)
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    REORDERED_TOLERANCES,
    UNSCALED_PRECISIONS,
    ZERO_GRAD_AFTER_STEP,
    PlannedFailure,
    assert_discard_note,
    refuses,
)
from lightning_optimizer.conformance.zeroing_rig import Form, ZeroRig
from lightning_optimizer.spec import (
    Cell,
    FailurePolicy,
    GradScalerSettings,
    ImplementationInfo,
    StepOutcome,
    TrainingContext,
)

MakeContext = Callable[..., TrainingContext]
A, S, SKIP, D = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE, StepOutcome.DISCARDED
EAGER = ("cpu", "cuda")
"""Where the checks that train windows run: no zeroing rule depends on the device, and on XLA every new graph
compiles (the check of ZERO-004 runs there too)."""
LEAVE = pytest.mark.features("user_zero_grad")
NO_PLAIN_BACKWARD = "16-mixed"
"""Under 16-mixed a closure's plain ``loss.backward()`` skips the loss scaling the wrapper owes (AMP-008)."""


def _form(cell: Cell, form: Form) -> Form:
    """``form``, except a plain ``loss.backward()`` under 16-mixed, which runs through the wrapper instead."""
    return "closure" if form == "loss.backward" and cell.precision == NO_PLAIN_BACKWARD else form


def _layers(rig: ZeroRig) -> list[torch.Tensor]:
    """Wrapper ``a``'s parameters, group by group."""
    return [p for group in rig.wrappers["a"].optimizer.param_groups for p in group["params"]]


# -- ZERO-003: the setting --------------------------------------------------------------------------------------

_NOT_BOOLS: list[object] = [1, 0, None, "no", "False", 1.0, (False,)]


@pytest.mark.requirement("ZERO-003")
@pytest.mark.cells(precisions=("32-true", "16-mixed"))
@pytest.mark.varies(faults=("invalid argument",), zero_grad_after_step=("True", "False"))
def test_zero_grad_after_step_is_a_construction_setting(
    make_context: MakeContext, cell: Cell, implementation: ImplementationInfo[Any]
) -> None:
    """``zero_grad_after_step`` reads back what construction was given, ``True`` by default; a non-bool is refused.

    Any value but ``True`` and ``False`` (``1``, ``None``, ``"no"``) raises ``TypeError`` at construction. ``False`` is
    taken by an implementation that claims ``"user_zero_grad"``; one that does not may refuse it with ``ValueError``.
    """
    default = make_context()
    assert default.zero_grad_after_step is True, (
        f"a context built without zero_grad_after_step reads {default.zero_grad_after_step!r}, not True [ZERO-003]"
    )
    assert make_context(zero_grad_after_step=True).zero_grad_after_step is True, (
        "zero_grad_after_step=True does not read back True [ZERO-003]"
    )
    for bad in _NOT_BOOLS:
        with refuses(
            TypeError,
            f"factory(cell, zero_grad_after_step={bad!r})",
            "ZERO-003: zero_grad_after_step is True or False; any other value raises TypeError at construction",
        ):
            make_context(zero_grad_after_step=bad)
    if "user_zero_grad" in implementation.features:
        leaving = make_context(zero_grad_after_step=False)
        assert leaving.zero_grad_after_step is False, (
            f"zero_grad_after_step=False reads back {leaving.zero_grad_after_step!r} [ZERO-003]"
        )
        return
    try:
        leaving = make_context(zero_grad_after_step=False)
    except ValueError:
        return  # not claimed: refusing it is allowed (ZERO-003)
    assert leaving.zero_grad_after_step is False, (
        f"zero_grad_after_step=False, accepted, reads back {leaving.zero_grad_after_step!r} [ZERO-003]"
    )


# -- ZERO-004: what a real step leaves ----------------------------------------------------------------------------


@pytest.mark.requirement("ZERO-004", "ZERO-001", "ZERO-003")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("zero_grad_after_step", ZERO_GRAD_AFTER_STEP)
@pytest.mark.varies(
    zero_grad_after_step=("True", "False"),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True"),
    make_optimizer_step=("None", "True"),
    wrappers=("2",),
    param_groups=("2 with other hyper-parameters",),
    optimizer=("SGD momentum", "Adam"),
    clipping=("norm",),
    loss_scale=("backed off",),
)
def test_a_taken_step_leaves_the_gradients_it_applied(
    make_context: MakeContext, cell: Cell, zero_grad_after_step: bool
) -> None:
    """After each real step the gradients are the plain loop's: ``None`` under ``True``, else what the step applied.

    Windows of 3 (by the schedule) and 1 (cut short), clipping by norm configured; under 16-mixed a window that
    overflows is skipped, and its gradients are ``None`` under both settings. Each real step of ``a`` leaves what it
    applied (its mean, unscaled and clipped, plus what it carried from the last step), which ``b``'s steps in between
    do not touch; the parameters are the plain loop's.
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=zero_grad_after_step, accumulate=3, clip=("norm", 2e-3))
    overflow = cell.precision == "16-mixed"
    for batch_idx in range(3):
        with rig.batch(batch_idx):
            rig.step("a", batch_idx)
            rig.step("b", batch_idx, True)
    with rig.batch(3):
        rig.step("a", 3, True)
        rig.step("b", 3, True)
    with rig.batch(4, is_last=True):
        outcome = rig.step("a", 4, True, blow_up=overflow)  # its gradients checked: None when skipped
        rig.step("b", 4, True)
    assert outcome is (SKIP if overflow else S), f"the plain loop's last step was {outcome} (a defect of the check)"
    rig.assert_params(f"windows of 3 and 1 under zero_grad_after_step={zero_grad_after_step}")


@pytest.mark.requirement("ZERO-004", "ZERO-005")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(precisions=("32-true", "16-mixed"))
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    window=("k >= 2 micro-steps", "1 micro-step", "carrying the last step's gradients"),
    make_optimizer_step=("None", "True"),
)
def test_a_window_carries_on_every_device(make_context: MakeContext, cell: Cell) -> None:
    """On every device (XLA's lazy tensors and its graph cut included) a step leaves what it applied, and carries it.

    One SGD with momentum: a window of 2, then windows of 1 that carry what the last step left.
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=2, kinds={"a": "sgd_momentum"}, groups=1)
    for batch_idx in range(4):
        with rig.batch(batch_idx):
            rig.step("a", batch_idx, None if batch_idx < 2 else True)
    assert rig.plain.carrying["a"], "the plain loop carried nothing (a defect of the check)"
    rig.assert_params(f"windows of 2, 1 and 1 carrying the last step's gradients on {cell.device} [ZERO-005]")


# -- ZERO-005: the window carries what the last step left ---------------------------------------------------------


@dataclass(frozen=True)
class CarryPlan:
    """Two wrappers' calls per batch (``make_optimizer_step``, ``None``: skip that wrapper), their forms, the epoch."""

    accumulate: int
    a: tuple[bool | Literal["-"] | None, ...]
    b: tuple[bool | Literal["-"] | None, ...]
    form_a: Form
    form_b: Form


_CARRY_PLANS = {
    # a: windows of 1 each; b: every other batch, by make_optimizer_step.
    "windows 1, 1, 1, 1": CarryPlan(1, (None, None, None, None), ("-", True, "-", True), "closure", "toggle_model"),
    # a: 2 by the schedule, 4 kept open by False, 1 flushed by the last batch; b: 3, then 1, 3.
    "windows 2, 4, flushed 1": CarryPlan(
        2,
        (None, None, None, False, None, None, None),
        (False, False, True, True, False, None, None),
        "backward",
        "closure",
    ),
    # a: 3 by the schedule, 2 cut short by True, 2 flushed; b: 1, 2, 1, 2, 1.
    "windows 3, cut short 2, flushed 2": CarryPlan(
        3,
        (None, None, None, None, True, None, None),
        (True, False, True, True, False, True, True),
        "loss.backward",
        "backward",
    ),
    "windows 4, flushed 3": CarryPlan(
        4,
        (None, None, None, None, None, None, None),
        (None, None, None, None, True, None, None),
        "toggle_model",
        "loss.backward",
    ),
}


@pytest.mark.requirement("ZERO-005", "ZERO-004", "ACC-001", "ACC-003")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("plan", list(_CARRY_PLANS))
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    window=(
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "partial, flushed by the last batch",
        "open while another optimizer steps",
        "open across a scale change",
        "carrying the last step's gradients",
    ),
    make_optimizer_step=("True", "False", "None"),
    wrappers=("2",),
    param_groups=("2 with other hyper-parameters",),
    optimizer=("SGD momentum", "Adam"),
    call_form=(
        "closure, wrapper.backward",
        "closure, loss.backward",
        "toggle_model block, then step()",
        "backward, then step()",
    ),
    loss_scale=("grown",),
)
def test_a_window_applies_what_it_carries_plus_its_own_mean(make_context: MakeContext, cell: Cell, plan: str) -> None:
    """Each real step applies what the last taken step left plus the mean of its window's own micro-steps.

    Two wrappers (SGD with momentum and Adam, two parameter groups each), windows of 1 to 4 micro-steps, cut short by
    ``True`` and flushed by the epoch's last batch, every call form; no ``zero_grad()``, so every window after the
    first carries. Under 16-mixed the scale grows every iteration: the carried part is neither unscaled nor rescaled
    again. After each real step the gradients it left are what it applied, and at the end the parameters are the
    plain loop's.
    """
    spec = _CARRY_PLANS[plan]
    growing = GradScalerSettings(init_scale=2.0**10, growth_interval=1)
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=spec.accumulate, grad_scaler=growing)
    length = len(spec.a)
    for batch_idx in range(length):
        with rig.batch(batch_idx, is_last=batch_idx == length - 1):
            for name, calls, form in (("a", spec.a, spec.form_a), ("b", spec.b, spec.form_b)):
                call = calls[batch_idx]
                if call != "-":
                    rig.step(name, batch_idx, call, _form(cell, form))
    carrying = [name for name, flag in rig.plain.carrying.items() if flag]
    assert carrying, "the plan's last real steps carried nothing (a defect of the check)"
    rig.assert_params(f"{plan}, no zero_grad(): each window carries the last step's gradients [ZERO-005]")


_ZERO_GRADS = [
    "set_to_none=True",
    "set_to_none=False",
    "with the window open",
    "after a backward took it",
    "set_to_none=False after a backward took it",
    "set_to_none=False in step()'s closure",
    "of the other wrapper",
]


@pytest.mark.requirement("ZERO-005", "ZERO-002", "ZERO-004")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("when", _ZERO_GRADS)
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    zero_grad=("set_to_none=True", "set_to_none=False", "with a window open", "of another wrapper"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    window=("1 micro-step", "k >= 2 micro-steps", "carrying the last step's gradients"),
    make_optimizer_step=("None",),
)
def test_zero_grad_clears_what_the_last_step_left(make_context: MakeContext, cell: Cell, when: str) -> None:
    """The wrapper's ``zero_grad()`` clears what the last step left until the window's first micro-step accumulated.

    ``set_to_none=True`` leaves ``None``, ``set_to_none=False`` zeros (which carry nothing): the next window applies
    its own mean alone. With the window open (a micro-step accumulated) it does nothing, and the window still
    carries. After a wrapper backward took the carried part (the window holds no micro-step yet) it clears both that
    backward's gradients and the carried part. The other wrapper's ``zero_grad()`` leaves this one's alone.
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=2)
    with rig.batch(0):
        rig.step("a", 0, True)
        rig.step("b", 0, True)
    a_params = _layers(rig)
    with rig.batch(1):
        if when in ("set_to_none=True", "set_to_none=False"):
            set_to_none = when == "set_to_none=True"
            rig.zero_grad("a", set_to_none)
            got = [p.grad for p in a_params]
            if set_to_none:
                assert all(g is None for g in got), f"zero_grad({when}) with no window open left gradients [ZERO-005]"
            else:
                assert all(g is not None and not bool(g.any()) for g in got), (
                    f"zero_grad({when}) with no window open did not leave zeros where the last step left gradients "
                    "[ZERO-005, ZERO-002]"
                )
            rig.step("a", 1, False)
        elif when == "with the window open":
            rig.step("a", 1, False)
            rig.zero_grad("a")
        elif when.endswith("after a backward took it"):
            set_to_none = not when.startswith("set_to_none=False")
            rig.wrappers["a"].backward(rig.loss("a", 1))
            rig.plain.backward("a", rig.plain_loss("a", 1))
            rig.zero_grad("a", set_to_none)
            got = [p.grad for p in a_params]
            if set_to_none:
                assert all(g is None for g in got), (
                    "zero_grad() after a backward took the carried part, before the window's first micro-step "
                    "accumulated, left gradients: it clears them, the carried part included [ZERO-005, ZERO-002]"
                )
            else:
                assert all(g is not None and not bool(g.any()) for g in got), (
                    "zero_grad(set_to_none=False) after a backward took the carried part did not leave zeros on "
                    f"every parameter ({sum(g is None for g in got)} left None): as torch's zero_grad(False), it "
                    "leaves zeros where gradients were, the taken ones included, so a parameter the next backward "
                    "does not reach is still stepped with a zero gradient [ZERO-005, ZERO-002]"
                )
            rig.step("a", 1, False, "backward")
        elif when == "set_to_none=False in step()'s closure":  # Lightning's closure: zero_grad, then backward
            seen: list[torch.Tensor | None] = []

            def zero_first() -> None:
                rig.wrappers["a"].zero_grad(set_to_none=False)
                seen.extend(None if p.grad is None else p.grad.clone() for p in a_params)

            rig.plain.take("a")
            rig.plain.zero_grad("a", set_to_none=False)
            rig.step("a", 1, False, before=zero_first)
            assert all(g is not None and not bool(g.any()) for g in seen), (
                "zero_grad(set_to_none=False) in step()'s closure, after the step() took the carried part and "
                f"before the closure's backward, left {sum(g is None for g in seen)} of {len(seen)} gradients None: "
                "as torch's zero_grad(False) it leaves zeros where the last step left gradients, so a parameter "
                "the backward does not reach is still stepped with a zero gradient [ZERO-005, ZERO-002]"
            )
        else:
            rig.zero_grad("b")
            rig.step("a", 1, False)
        rig.step("b", 1, True)
    with rig.batch(2):
        rig.step("a", 2, True, "backward")
    assert rig.plain.carrying["a"] == (when in ("with the window open", "of the other wrapper")), (
        "the plain loop carried other than the check meant (a defect of the check)"
    )
    rig.assert_params(f"zero_grad() {when}, then a window of 2 [ZERO-005]")


@pytest.mark.requirement("ZERO-005", "CLIP-002")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("form", ["closure", "backward"])
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    clipping=("unscale_gradients() by hand",),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    window=("1 micro-step", "k >= 2 micro-steps", "carrying the last step's gradients"),
)
def test_unscale_gradients_makes_the_sum_the_user_clips(make_context: MakeContext, cell: Cell, form: Form) -> None:
    """``unscale_gradients()`` before the closing step makes the gradients the carried part plus the window's mean.

    The user's ``clip_grad_norm_`` then sees that sum (its norm is the plain loop's, unscaled under 16-mixed) and
    clips it, and the closing step applies what was clipped: windows of 3 and of 1.
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=3, kinds={"a": "sgd_momentum", "b": "sgd"})
    wrapper = rig.wrappers["a"]
    norms: list[tuple[float, float]] = []

    def unscale_and_clip() -> None:
        wrapper.unscale_gradients()
        rig.plain.prepare("a")
        got = [p.grad for group in wrapper.optimizer.param_groups for p in group["params"]]
        want = [p.grad for p in rig.plain.params("a")]
        assert_grads_close(
            got,
            want,
            cell,
            "after unscale_gradients(): the gradients are the carried part plus the window's mean, unscaled "
            "[ZERO-005, CLIP-002]",
            reordered=True,
        )
        present = [p for group in wrapper.optimizer.param_groups for p in group["params"] if p.grad is not None]
        got_norm = float(torch.nn.utils.clip_grad_norm_(present, 1e-3))
        want_norm = float(
            torch.nn.utils.clip_grad_norm_([p for p in rig.plain.params("a") if p.grad is not None], 1e-3)
        )
        norms.append((got_norm, want_norm))

    for batch_idx in range(6):  # windows of 3, the second carrying the first's gradients
        with rig.batch(batch_idx):
            rig.step("a", batch_idx, form=form, then=unscale_and_clip if batch_idx == 5 else None)
    with rig.batch(6):
        rig.step("a", 6, True, form, then=unscale_and_clip)  # a window of 1, carrying
    tolerance = max(1e-2, 2 * REORDERED_TOLERANCES[cell.precision].rtol)
    for got_norm, want_norm in norms:
        assert math.isclose(got_norm, want_norm, rel_tol=tolerance), (
            f"the norm the user's clip_grad_norm_ saw after unscale_gradients() is {got_norm:.6g}, the plain loop's "
            f"(the carried part plus the window's mean, unscaled) is {want_norm:.6g} [ZERO-005, CLIP-002]"
        )
    assert rig.plain.carrying["a"], "the plain loop carried nothing (a defect of the check)"
    rig.assert_params("windows carrying the last step's gradients, clipped by hand after unscale_gradients()")


@pytest.mark.requirement("ZERO-005", "CLIP-001")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    clipping=("norm", "value"),
    window=("k >= 2 micro-steps", "carrying the last step's gradients"),
    param_groups=("2 with other hyper-parameters",),
)
def test_configured_clipping_clips_the_carried_part_with_the_rest(
    make_context: MakeContext, cell: Cell, algorithm: Literal["norm", "value"]
) -> None:
    """Configured clipping clips what the step applies: the carried part plus the window's mean, together.

    Thresholds below the sum's norm (and most of its elements): a carried part added after clipping would be applied
    unclipped.
    """
    threshold = 1e-3 if algorithm == "norm" else 1e-4
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=2, clip=(algorithm, threshold))
    for batch_idx in range(6):
        with rig.batch(batch_idx):
            rig.step("a", batch_idx)
            rig.step("b", batch_idx)
    assert rig.plain.carrying["a"] and rig.plain.carrying["b"], "nothing was carried (a defect of the check)"
    rig.assert_params(f"windows of 2 carrying the last step's gradients, clipped by {algorithm} [ZERO-005, CLIP-001]")


@pytest.mark.requirement("ZERO-005", "AMP-002", "AMP-006")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER, precisions=("16-mixed",))
@pytest.mark.parametrize("form", ["closure", "backward"])
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    loss_scale=("grown", "backed off", "settings given to the factory"),
    window=("open across a scale change", "carrying the last step's gradients", "k >= 2 micro-steps"),
    wrappers=("2",),
    call_form=("closure, wrapper.backward", "backward, then step()"),
)
def test_the_carried_part_is_neither_unscaled_nor_rescaled_again(
    make_context: MakeContext, cell: Cell, form: Form
) -> None:
    """16-mixed: what the last step left is unscaled already, and stays so across scale changes, left or carried.

    The scale grows every iteration, and backs off when ``b`` overflows while ``a``'s carrying window is open and
    while ``a``'s last step's gradients wait to be taken; ``a``'s windows of 2 and 3 apply the carried part as it
    was. The plain loop drives a ``GradScaler`` by hand: the carried part aside, added after ``unscale_``.
    """
    settings = GradScalerSettings(init_scale=2.0**12, growth_interval=1)
    rig = ZeroRig(
        make_context,
        cell,
        zero_grad_after_step=False,
        accumulate=2,
        grad_scaler=settings,
        kinds={"a": "sgd", "b": "sgd"},
    )
    overflow_b = {2, 5}
    calls_a: list[bool | None] = [None, None, None, False, None, None, None, None]
    for batch_idx, call in enumerate(calls_a):
        with rig.batch(batch_idx):
            rig.step("a", batch_idx, call, form)
            rig.step("b", batch_idx, True, form, blow_up=batch_idx in overflow_b)
    assert rig.plain.carrying["a"], "a's last window carried nothing (a defect of the check)"
    rig.assert_params("16-mixed windows carrying the last step's gradients across growth and back-off")


@pytest.mark.requirement("ZERO-005", "ZERO-004", "CLOS-004")
@pytest.mark.features("user_zero_grad", "closure_evaluating_optimizers")
@pytest.mark.cells(devices=EAGER, precisions=("64-true", "32-true", "bf16-mixed", "bf16-true"))
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    optimizer=("LBFGS", "SGD momentum"),
    wrappers=("2",),
    window=("1 micro-step", "carrying the last step's gradients"),
)
def test_an_optimizer_that_evaluates_its_closure_carries_nothing(make_context: MakeContext, cell: Cell) -> None:
    """An LBFGS carries nothing: each evaluation starts from no gradient; beside it an SGD carries as it should.

    After each LBFGS step its gradients are what its last evaluation left, as a plain LBFGS loop leaves them.
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, kinds={"a": "lbfgs", "b": "sgd_momentum"}, groups=1)
    lbfgs = rig.plain.optimizers["a"]
    for batch_idx in range(3):
        with rig.batch(batch_idx):
            result = rig.wrappers["a"].step(functools.partial(_lbfgs_closure, rig, batch_idx))
            lbfgs.step(functools.partial(_plain_lbfgs_closure, rig, lbfgs, batch_idx))
            assert result is not None
            assert last_outcome(rig.wrappers["a"]) is S, f"the LBFGS step reports {last_outcome(rig.wrappers['a'])}"
            rig.assert_left("a", f"LBFGS step {batch_idx}")
            rig.step("b", batch_idx, True)
    assert rig.plain.carrying["b"], "the SGD carried nothing (a defect of the check)"
    rig.assert_params("an LBFGS beside a carrying SGD: each LBFGS evaluation starts from no gradient [ZERO-005]")


def _lbfgs_closure(rig: ZeroRig, batch_idx: int) -> torch.Tensor:
    loss = rig.loss("a", batch_idx)
    rig.wrappers["a"].backward(loss)
    return loss


def _plain_lbfgs_closure(rig: ZeroRig, lbfgs: torch.optim.Optimizer, batch_idx: int) -> float:
    """The plain LBFGS loop's closure: its gradients set to ``None``, then the backward of its loss."""
    lbfgs.zero_grad(set_to_none=True)
    loss = rig.plain_loss("a", batch_idx)
    loss.backward()
    return float(loss)


# -- ZERO-006: gradients changed in place before they were taken ---------------------------------------------------


@dataclass(frozen=True)
class InPlace:
    """How the user changed what the last step left, and which call then takes it."""

    change: Callable[[ZeroRig], object]
    """On the implementation's side, after the real step that left the gradients."""
    takes: Literal["step(closure)", "step()", "wrapper.backward", "the other wrapper's backward"]


def _plain_backward(rig: ZeroRig) -> None:
    rig.loss("a", 1).backward()


def _module_zero_grad(rig: ZeroRig) -> None:
    rig.model.a.zero_grad(set_to_none=False)


def _inner_zero_grad(rig: ZeroRig) -> None:
    rig.wrappers["a"].optimizer.zero_grad(set_to_none=False)


def _scaled_in_place(rig: ZeroRig) -> None:
    with torch.no_grad():
        for param in _layers(rig):
            if param.grad is not None:
                param.grad.mul_(2.0)


_IN_PLACE = {
    "loss.backward() before step()": InPlace(_plain_backward, "step()"),
    "module zero_grad(set_to_none=False), then step(closure)": InPlace(_module_zero_grad, "step(closure)"),
    "inner zero_grad(set_to_none=False), then wrapper.backward": InPlace(_inner_zero_grad, "wrapper.backward"),
    "grad.mul_(2), then the other wrapper's backward": InPlace(_scaled_in_place, "the other wrapper's backward"),
}


@pytest.mark.requirement("ZERO-006", "ZERO-005", "FAIL-002")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.parametrize("how", list(_IN_PLACE))
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    faults=("left gradients changed in place",),
    zero_grad=("set_to_none=False",),
    call_form=("closure, wrapper.backward", "backward, then step()", "toggle_model block, then step()"),
    on_failure=("discard", "restore"),
)
def test_gradients_changed_in_place_before_they_were_taken_are_refused(
    make_context: MakeContext, cell: Cell, how: str, on_failure: FailurePolicy
) -> None:
    """The call that would take gradients the last step left and the user changed in place raises, changing nothing.

    ``loss.backward()`` before ``step()``, an in-place ``zero_grad(set_to_none=False)`` of the module or of the inner
    optimizer, a gradient scaled in place: the ``step()`` or the (any wrapper's) ``backward()`` that would take them
    raises ``RuntimeError`` naming ``opt.zero_grad()``; parameters, gradients and outcomes are as before, under both
    failure policies. After ``opt.zero_grad()`` the corrected call applies its own gradients alone.
    """
    plan = _IN_PLACE[how]
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, on_failure=on_failure)
    with rig.batch(0):
        rig.step("a", 0, True)
        rig.step("b", 0, True)
    plan.change(rig)
    before = snapshot(rig.model)
    outcomes = [last_outcome(w) for w in rig.wrappers.values()]
    a, b = rig.wrappers["a"], rig.wrappers["b"]
    with rig.batch(1):
        with refuses(
            RuntimeError,
            f"{plan.takes} that would take the gradients the last step left, after {how}",
            "ZERO-006: gradients a real step left and that changed in place before a window took them are refused by "
            "the call that would take them, naming opt.zero_grad()",
            match=r"zero_grad\(\)",
        ):
            if plan.takes == "step()":
                a.step()
            elif plan.takes == "step(closure)":
                a.step(lambda: a.backward(rig.loss("a", 1)))
            elif plan.takes == "wrapper.backward":
                with a.toggle_model():
                    a.backward(rig.loss("a", 1))
            else:  # b's loss through both halves: its backward reaches a's parameters, which require grad
                b.backward(rig.loss("b", 1) + rig.loss("a", 1))
        what = f"the refused {plan.takes} after {how} (on_failure={on_failure!r})"
        assert_unchanged(rig.model, before, what)
        now = [last_outcome(w) for w in rig.wrappers.values()]
        assert now == outcomes, f"{what}: last_outcome {outcome_names(now)}, before {outcome_names(outcomes)}"
        rig.zero_grad("a")
        rig.zero_grad("b")
        rig.step("a", 1, True, "backward")
        rig.step("b", 1, True)
    rig.assert_params(f"after {how}, the refusal and opt.zero_grad(): the corrected window applies its own mean")


def _replace_by_zeros(rig: ZeroRig) -> None:
    for param in _layers(rig):
        if param.grad is not None:
            param.grad = torch.zeros_like(param.grad)


_CLEARED: dict[str, Callable[[ZeroRig], object]] = {
    "model.zero_grad()": lambda rig: rig.model.zero_grad(),
    "inner zero_grad()": lambda rig: rig.wrappers["a"].optimizer.zero_grad(),
    "gradients replaced by new zeros": _replace_by_zeros,
}


@pytest.mark.requirement("ZERO-006")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("how", list(_CLEARED))
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    zero_grad=("set_to_none=True",),
    call_form=("closure, wrapper.backward", "toggle_model block, then step()"),
    window=("k >= 2 micro-steps",),
)
def test_gradients_set_to_none_or_replaced_carry_nothing(make_context: MakeContext, cell: Cell, how: str) -> None:
    """Gradients the last step left, set to ``None`` or replaced outside the wrapper, carry nothing and are not refused.

    ``model.zero_grad()`` (Lightning's own ``optimizer_zero_grad`` clears so), the inner optimizer's ``zero_grad()``,
    new zero tensors: the next window (its first micro-step in a ``toggle_model`` block, then through ``step``)
    applies its own mean alone.
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=2)
    with rig.batch(0):
        rig.step("a", 0, True)
    _CLEARED[how](rig)
    rig.plain.zero_grad("a", set_to_none=how != "gradients replaced by new zeros")
    for batch_idx in (2, 3):
        with rig.batch(batch_idx):
            rig.step("a", batch_idx, None, "toggle_model" if batch_idx == 2 else "closure")
    assert not rig.plain.carrying["a"], "the plain loop carried something (a defect of the check)"
    rig.assert_params(f"{how} after a real step, then a window of 2: nothing carried [ZERO-006]")


@pytest.mark.requirement("ZERO-006", "ZERO-005")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER, precisions=UNSCALED_PRECISIONS)
@pytest.mark.parametrize("set_to_none", [True, False], ids=["model.zero_grad()", "model.zero_grad(False)"])
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    zero_grad=("set_to_none=True", "set_to_none=False"),
    call_form=("loss.backward(), then step()", "closure, wrapper.backward"),
    window=("k >= 2 micro-steps",),
)
def test_a_gradient_written_after_the_left_one_was_cleared_is_the_windows_own(
    make_context: MakeContext, cell: Cell, set_to_none: bool
) -> None:
    """After ``model.zero_grad()``, a ``loss.backward()`` before the window's first ``step()`` is a micro-step of it.

    Set to ``None``, the left gradients carry nothing: the tensor the backward then writes is new, the window's own,
    averaged with its next micro-step, not carried whole. Zeroed in place (``set_to_none=False``), what the backward
    adds onto the zeros is an in-place change of the left tensor: refused before anything changes [ZERO-006].
    """
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=2)
    with rig.batch(0):
        rig.step("a", 0, True)
    rig.model.zero_grad(set_to_none=set_to_none)
    rig.loss("a", 1).backward()
    wrapper = rig.wrappers["a"]
    if not set_to_none:
        before = [p.detach().clone() for p in _layers(rig)]
        with pytest.raises(RuntimeError, match="zero_grad"):
            wrapper.step()
        assert all(torch.equal(b, p) for b, p in zip(before, _layers(rig), strict=True)), (
            "the refused step() changed a parameter [ZERO-006]"
        )
        return
    rig.plain.zero_grad("a", set_to_none=True)
    rig.plain.backward("a", rig.plain_loss("a", 1))
    with rig.batch(2):
        wrapper.step()
        rig.after_call("a", False, "a.step() after model.zero_grad() and loss.backward() on batch 2")
    with rig.batch(3):
        rig.step("a", 3, None)
    assert not rig.plain.carrying["a"], "the plain loop carried something (a defect of the check)"
    rig.assert_params(
        "model.zero_grad(), then loss.backward() and step(), then a closing micro-step: the new gradient is the "
        "window's first micro-step, averaged with its second, not carried whole [ZERO-006, ZERO-005]"
    )


# -- ZERO-007: failures, states, copies ---------------------------------------------------------------------------


_WHERE = [
    "first micro-step",
    "later micro-step",
    "inner step",
    "before any backward",
]


@pytest.mark.requirement("ZERO-007", "FAIL-002", "FAIL-003", "FAIL-004")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.parametrize("where", _WHERE)
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    on_failure=("discard", "restore"),
    faults=("raising closure", "raising closure after its backward", "raising inner step"),
    window=("1 micro-step", "k >= 2 micro-steps", "carrying the last step's gradients"),
)
def test_a_failed_window_discards_or_restores_its_carried_part(
    make_context: MakeContext, cell: Cell, where: str, on_failure: FailurePolicy
) -> None:
    """A call that fails: under ``"discard"`` what the window carried goes with it, under ``"restore"`` it stays.

    The failing call is the window's first micro-step (it took the carried part), a later one, or the closing step
    whose inner step raises. Discarded: the gradients are ``None`` and the exception's note says that the carried
    gradients went too; the next window applies its own mean alone. Restored (or failed before any backward, under
    both): the gradients are as before the call, and the retried window applies the carried part plus its mean.
    """
    rig = ZeroRig(
        make_context,
        cell,
        zero_grad_after_step=False,
        accumulate=2,
        on_failure=on_failure,
        kinds={"a": "flaky_sgd", "b": "adam"},
    )
    a = rig.wrappers["a"]
    with rig.batch(0):
        rig.step("a", 0, True)
        rig.step("b", 0, True)
    later = where == "later micro-step"
    inner = where == "inner step"
    with rig.batch(1):
        if later or inner:
            rig.step("a", 1, False)
        discard = on_failure == "discard" and where != "before any backward"
        before = snapshot(rig.model)
        held = rig.plain.pending["a"]

        def failing() -> None:
            if where != "before any backward":
                a.backward(rig.loss("a", 2))
            raise PlannedFailure(f"the closure fails on purpose ({where})")

        flaky = a.optimizer
        assert isinstance(flaky, torch.optim.SGD) and hasattr(flaky, "fail")
        with refuses(
            PlannedFailure,
            f"a.step() failing at its {where}",
            "FAIL-002, FAIL-003: a failed call's exception propagates",
        ) as raised:
            if inner:
                flaky.fail = True
                try:
                    a.step(lambda: a.backward(rig.loss("a", 2)), make_optimizer_step=True)
                finally:
                    flaky.fail = False
            else:
                a.step(failing, make_optimizer_step=False)
        what = f"after a.step() failed at its {where} (on_failure={on_failure!r})"
        own = {id(p) for p in _layers(rig)}
        if discard:
            now = snapshot(rig.model)
            for param, grad in zip(rig.model.parameters(), now.grads, strict=True):
                if id(param) in own:
                    assert grad is None, (
                        f"{what}: a's gradients are not None: the discarded window's carried part goes with it "
                        "[ZERO-007, FAIL-003]"
                    )
            assert last_outcome(a) is D, f"{what}: last_outcome {last_outcome(a)}, not DISCARDED [FAIL-003]"
            assert_discard_note(raised.value, flaky, (held, held + 1), what)
            notes = " ".join(n for n in getattr(raised.value, "__notes__", ()) if isinstance(n, str))
            assert "carried" in notes.lower(), (
                f"{what}: the exception's note {notes!r} does not say that the gradients the window carried from the "
                "last real step went too [ZERO-007]"
            )
            rig.plain.discard("a")
        else:
            assert_unchanged(rig.model, before, f"{what}: nothing of the window or what it carried changed [ZERO-007]")
        rig.step("a", 3, False)
    with rig.batch(2):
        rig.step("a", 4, True)
        rig.step("b", 4, True)
    assert rig.plain.carrying["a"] == (not discard), "the plain loop carried other than the check meant"
    rig.assert_params(f"{what}, then the retried window [ZERO-007]")


_STATES = {
    "checkpoint mid-window": pytest.param("checkpoint mid-window", marks=pytest.mark.features("checkpointing")),
    "checkpoint between windows": pytest.param(
        "checkpoint between windows", marks=pytest.mark.features("checkpointing")
    ),
    "pickle mid-window": pytest.param("pickle mid-window", marks=pytest.mark.features("pickling")),
    "deepcopy mid-window": pytest.param("deepcopy mid-window", marks=pytest.mark.features("pickling")),
}


@pytest.mark.requirement("ZERO-007", "CKPT-002", "PICKLE-001")
@pytest.mark.features("user_zero_grad")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("how", list(_STATES.values()))
@pytest.mark.varies(
    zero_grad_after_step=("False",),
    copies=("checkpoint", "pickle", "deepcopy"),
    window=("k >= 2 micro-steps", "carrying the last step's gradients"),
    zero_grad=("set_to_none=True",),
)
def test_a_taken_carried_part_is_window_state(make_context: MakeContext, cell: Cell, how: str) -> None:
    """Once taken, the carried part is the window's: a checkpoint or copy taken mid-window holds it.

    Resumed in fresh objects (or trained on as a copy), the window applies the carried part plus its mean: the plain
    loop's parameters, and the uninterrupted run's bit for bit; the original of a copy does not change. Between
    windows what the last step left is the user's: a checkpoint then continues where the user's ``zero_grad()``
    clears it at the window's start in both runs.
    """
    between = how == "checkpoint between windows"
    rig = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=3)
    twin = ZeroRig(make_context, cell, zero_grad_after_step=False, accumulate=3)

    def run(rig: ZeroRig, batch_idx: int) -> None:
        with rig.batch(batch_idx):
            if between and batch_idx == 3:
                rig.zero_grad("a")
                rig.zero_grad("b")
            rig.step("a", batch_idx)
            rig.step("b", batch_idx, batch_idx in (1, 5))

    cut = 3 if between else 4
    for batch_idx in range(cut):
        run(rig, batch_idx)
        run(twin, batch_idx)
    if how.startswith("checkpoint"):
        rig.resume(rig.checkpoint())
        original = None
    else:
        before = snapshot(rig.model)
        state = cloned(rig.context.state_dict())
        original = (rig.copied("pickle" if how.startswith("pickle") else "deepcopy"), before, state)
        assert rig.context.zero_grad_after_step is False, (
            f"a {how.split()[0]} of a context built with zero_grad_after_step=False reads "
            f"{rig.context.zero_grad_after_step!r} [ZERO-007]"
        )
    for batch_idx in range(cut, 9):
        run(rig, batch_idx)
        run(twin, batch_idx)
    assert rig.plain.carrying["a"] and rig.plain.carrying["b"], "nothing was carried (a defect of the check)"
    rig.assert_params(f"after a {how} [ZERO-007]")
    assert_same_values(
        param_values(rig.model.parameters()),
        param_values(twin.model.parameters()),
        f"after a {how}, against the uninterrupted run [ZERO-007, CKPT-002]",
    )
    if original is not None:
        (context, model, _), before, state = original
        assert_unchanged(model, before, f"the original of the {how} after the copy trained on [PICKLE-001]")
        problem = state_diff(cloned(context.state_dict()), state, "context.state_dict()")
        assert problem is None, f"the original of the {how} after the copy trained on: {problem} [PICKLE-001]"


@pytest.mark.requirement("ZERO-007", "CKPT-003")
@pytest.mark.features("user_zero_grad", "checkpointing")
@pytest.mark.cells(devices=EAGER, precisions=("32-true", "16-mixed"))
@pytest.mark.parametrize("saved_with", [True, False], ids=["saved-clearing", "saved-leaving"])
@pytest.mark.varies(
    zero_grad_after_step=("True", "False"),
    faults=("refused load",),
    copies=("checkpoint",),
    window=("k >= 2 micro-steps",),
)
def test_a_state_of_the_other_setting_is_refused(make_context: MakeContext, cell: Cell, saved_with: bool) -> None:
    """``load_state_dict`` refuses a state saved under the other ``zero_grad_after_step`` with ``ValueError``.

    Saved with a window open (and, under ``False``, a carried part); the refused load changes nothing: the loading
    context's own windows and state are as before, and it trains on to the plain loop's parameters.
    """
    source = ZeroRig(make_context, cell, zero_grad_after_step=saved_with, accumulate=3)
    target = ZeroRig(make_context, cell, zero_grad_after_step=not saved_with, accumulate=3)
    for rig in (source, target):
        for batch_idx in range(4):
            with rig.batch(batch_idx):
                rig.step("a", batch_idx)
                rig.step("b", batch_idx, True)
    saved = source.checkpoint()["context"]
    before, state = snapshot(target.model), cloned(target.context.state_dict())
    with refuses(
        ValueError,
        f"load_state_dict() of a state saved with zero_grad_after_step={saved_with} into a context built with "
        f"zero_grad_after_step={not saved_with}",
        "ZERO-007, CKPT-003: a state of the other zero_grad_after_step is refused before anything changes",
    ):
        target.context.load_state_dict(saved)
    what = "after the refused load_state_dict() of the other setting"
    assert_unchanged(target.model, before, what)
    problem = state_diff(cloned(target.context.state_dict()), state, "context.state_dict()")
    assert problem is None, f"{what}: {problem} [CKPT-003]"
    for batch_idx in range(4, 6):
        with target.batch(batch_idx, is_last=batch_idx == 5):
            target.step("a", batch_idx)
            target.step("b", batch_idx, True)
    target.assert_params(f"{what}, trained on")
