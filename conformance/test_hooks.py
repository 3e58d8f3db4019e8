"""Checks of the hooks a framework registers on a training context (HOOK-001 to HOOK-004).

Two wrappers over the two halves of a model (SGD with momentum on one, Adam on the other) run schedules of
windows; the hooks record what they see. The expected order of events is worked out from the schedule, the
gradients the ``before_optimizer_step`` hook sees come from a plain-PyTorch loop (the window's mean, unscaled under
16-mixed, one ``GradScaler`` for both optimizers updated once per batch), and each ``after_step`` outcome is the
one a plain loop's step post-hook counter gives.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_same_grads, assert_same_values, grads, param_values
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    Batch,
    Halves,
    assert_discard_note,
    assert_params_close,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    mse,
    oracle_step_done,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    oracle_loss,
    plain_scaler,
    real_step,
    scaled_backward,
    update_scaler,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, OptimizerWrapper, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, K = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE
OVERFLOWING = GradScalerSettings(init_scale=2.0**8, growth_interval=1)
"""A scale far from float16's range, growing after each finite step: only the planted batch overflows.

Overflow by the scale alone would sit at the edge of float16's range, where a backend that fuses differently
(XLA compiles the oracle's and the implementation's graphs apart) can round one side to inf and not the other.
"""
OVERFLOWING_BATCH, OVERFLOW = 2, 1e5
"""Under 16-mixed, batch 2's inputs are scaled by 1e5: the float16 forward overflows, so its steps are skipped."""

SCHEDULES: dict[str, Sequence[bool | None]] = {
    "windows 1, 3, 2 by make_optimizer_step": (True, False, False, True, False, True),
    "schedule of 2 inside batch()": (None, None, None, None, None, None),
    "windows 2, 1, 3 and the flushed last": (False, True, True, None, False, None),
}
"""The SGD wrapper's ``make_optimizer_step`` per batch; the Adam wrapper steps on every even batch."""


@dataclass
class Event:
    """One hook call: which hook, for which wrapper, and what it was given or saw."""

    kind: str
    wrapper: str
    loss: torch.Tensor | None = None
    outcome: StepOutcome | None = None
    grads: list[torch.Tensor] = field(default_factory=list)


def _present(copies: list[torch.Tensor | None]) -> list[torch.Tensor]:
    """The gradients that are there (copies of a wrapper's or an optimizer's gradients)."""
    return [grad for grad in copies if grad is not None]


def _wrapper_grads(wrapper: OptimizerWrapper[Any]) -> list[torch.Tensor]:
    return _present(grads(param for group in wrapper.param_groups for param in group["params"]))


class Recorder:
    """Hooks that record every call, naming the wrapper by its inner optimizer."""

    def __init__(self, names: dict[int, str]) -> None:
        self.names = names
        self.events: list[Event] = []

    def name(self, wrapper: OptimizerWrapper[Any]) -> str:
        """The wrapper's name, by its inner optimizer."""
        return self.names[id(wrapper.optimizer)]

    def before_backward(self, wrapper: OptimizerWrapper[Any], loss: torch.Tensor) -> None:
        """Record the call and the wrapper's gradients (autograd has not run yet)."""
        self.events.append(Event("before_backward", self.name(wrapper), loss=loss, grads=_wrapper_grads(wrapper)))

    def after_backward(self, wrapper: OptimizerWrapper[Any], loss: torch.Tensor) -> None:
        """Record the call and the wrapper's gradients (autograd has run)."""
        self.events.append(Event("after_backward", self.name(wrapper), loss=loss, grads=_wrapper_grads(wrapper)))

    def before_optimizer_step(self, wrapper: OptimizerWrapper[Any]) -> None:
        """Record the call and the wrapper's gradients."""
        self.events.append(Event("before_optimizer_step", self.name(wrapper), grads=_wrapper_grads(wrapper)))

    def after_step(self, wrapper: OptimizerWrapper[Any], outcome: StepOutcome) -> None:
        """Record the call and the outcome."""
        self.events.append(Event("after_step", self.name(wrapper), outcome=outcome))

    def register(self, context: TrainingContext) -> Any:
        """Register all four on ``context``; the handle."""
        return context.register_hooks(
            before_backward=self.before_backward,
            after_backward=self.after_backward,
            before_optimizer_step=self.before_optimizer_step,
            after_step=self.after_step,
        )


class _Pair:
    """The two wrappers over a ``Halves`` model in a context, and a plain loop of the same optimizers."""

    def __init__(self, make_context: MakeContext, cell: Cell, **settings: Any) -> None:
        self.cell = cell
        self.device, self.dtype = cell_device(cell), cell_dtype(cell)
        self.context = make_context(**settings)
        base = Halves(51, 52)
        oracle = oracle_copy(base, cell)
        model = self.context.prepare_module(base)
        assert isinstance(model, Halves) and isinstance(oracle, Halves)
        self.model, self.oracle = model, oracle
        self.sgd = self.context.wrap(torch.optim.SGD(model.a.parameters(), lr=0.1, momentum=0.9))
        self.adam = self.context.wrap(torch.optim.Adam(model.b.parameters(), lr=0.01))
        self.names = {id(self.sgd.optimizer): "sgd", id(self.adam.optimizer): "adam"}

    def step(self, wrapper: OptimizerWrapper[Any], half: torch.nn.Module, batch: Batch, make: bool | None) -> Any:
        """One ``step(closure)``; returns the loss the closure backpropagated."""
        losses: list[torch.Tensor] = []

        def closure() -> torch.Tensor:
            with self.context.autocast():
                loss = mse(half, batch, self.device, self.dtype)
            wrapper.backward(loss)
            losses.append(loss)
            return loss

        wrapper.step(closure, make_optimizer_step=make)
        return losses[0]


def _closes(schedule: Sequence[bool | None], batch_idx: int) -> bool:
    make = schedule[batch_idx]
    if make is not None:
        return make
    return (batch_idx + 1) % 2 == 0 or batch_idx == len(schedule) - 1


def _plain_loop(pair: _Pair, batches: Sequence[Batch], schedule: Sequence[bool | None], scaler_settings: Any) -> Any:
    """The plain loop: window means, one scaler updated once per batch after its steps (AMP-003).

    An open window's gradients are rescaled when the scale changes (AMP-006).
    """
    cell, oracle = pair.cell, pair.oracle
    sgd = torch.optim.SGD(oracle.a.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(oracle.b.parameters(), lr=0.01)
    scaler = plain_scaler(cell, scaler_settings or GradScalerSettings())
    applied: dict[str, int] = {"sgd": 0, "adam": 0}
    sgd.register_step_post_hook(lambda *_: applied.__setitem__("sgd", applied["sgd"] + 1))
    adam.register_step_post_hook(lambda *_: applied.__setitem__("adam", applied["adam"] + 1))
    prepared: list[tuple[str, list[torch.Tensor], StepOutcome]] = []

    def step(name: str, optimizer: torch.optim.Optimizer, length: int) -> None:
        before, seen = applied[name], []
        real_step(optimizer, length, scaler, after_prepare=lambda params: seen.extend(_present(grads(params))))
        prepared.append((name, seen, S if applied[name] > before else K))

    pending = 0
    for batch_idx, batch in enumerate(batches):
        stepped = False
        scaled_backward(oracle_loss(oracle.a, batch, cell, factor=1.0), scaler)
        pending += 1
        if _closes(schedule, batch_idx):
            step("sgd", sgd, pending)
            pending, stepped = 0, True
        if batch_idx % 2 == 0:
            scaled_backward(oracle_loss(oracle.b, batch, cell, factor=1.0), scaler)
            step("adam", adam, 1)
            stepped = True
        if stepped:  # the open window's gradients follow the scale (AMP-006)
            update_scaler(scaler, oracle.a.parameters() if pending else ())
        oracle_step_done(cell)
    return prepared


def _assert_backward_hooks_surround_autograd(events: list[Event], losses: list[torch.Tensor]) -> None:
    """Both backward hooks got each loss as passed, and the gradients changed between them (autograd ran inside)."""
    backwards = [e for e in events if e.kind == "before_backward"]
    assert all(e.loss is loss for e, loss in zip(backwards, losses, strict=True)), "a backward hook got another loss"
    afters = [e for e in events if e.kind == "after_backward"]
    assert all(e.loss is loss for e, loss in zip(afters, losses, strict=True))
    for i, (before, after) in enumerate(zip(backwards, afters, strict=True)):
        unchanged = len(before.grads) == len(after.grads) and all(
            torch.equal(a, b) for a, b in zip(before.grads, after.grads, strict=True)
        )
        assert not unchanged, f"backward {i}: the gradients were the same in both hooks (autograd ran outside them)"


def _assert_steps_saw_what_they_apply(
    events: list[Event], plain: list[tuple[str, list[torch.Tensor], StepOutcome]], cell: Cell
) -> None:
    """Each ``before_optimizer_step`` saw, within tolerance, the gradients the plain loop's real step applies."""
    seen = [e for e in events if e.kind == "before_optimizer_step"]
    tol = tolerance_for(cell)
    assert len(seen) == len(plain)
    for i, (event, (name, applied, _)) in enumerate(zip(seen, plain, strict=True)):
        assert event.wrapper == name
        assert len(event.grads) == len(applied)
        for got, want in zip(event.grads, applied, strict=True):
            assert torch.allclose(
                got.double().cpu(), want.double().cpu(), rtol=tol.rtol, atol=tol.atol, equal_nan=True
            ), f"real step {i} ({name}): before_optimizer_step saw other gradients than the step applies"


@pytest.mark.requirement("HOOK-001", "HOOK-002", "HOOK-003")
@pytest.mark.features("hooks")
@pytest.mark.cells(devices=("cpu", "cuda"))  # the hooks are the device's: XLA runs them in the fault check below
@pytest.mark.parametrize("schedule", SCHEDULES.values(), ids=SCHEDULES)
@pytest.mark.varies(
    wrappers=("2",),
    optimizer=("SGD momentum", "Adam"),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
    loss_scale=("backed off", "grown", "settings given to the factory"),
    outcome_read=("after its own call",),
)
def test_hooks_follow_every_backward_and_step(
    make_context: MakeContext, cell: Cell, schedule: Sequence[bool | None]
) -> None:
    """Each hook once per backward, real step or call, in order, seeing what the rules say.

    Each backward runs between its two hooks, with the loss as passed; ``before_optimizer_step`` runs once per real
    step with the gradients the step applies (skipped ones included); ``after_step`` after each call, with its
    outcome.
    """
    settings = OVERFLOWING if cell.precision == "16-mixed" else None
    pair = _Pair(make_context, cell, accumulate_grad_batches=2, grad_scaler=settings)
    recorder = Recorder(pair.names)
    recorder.register(pair.context)
    batches = make_batches(len(schedule), seed=13)
    if cell.precision == "16-mixed":
        x, y = batches[OVERFLOWING_BATCH]
        batches[OVERFLOWING_BATCH] = (x * OVERFLOW, y)
    expected: list[tuple[str, str]] = []
    losses: list[torch.Tensor] = []
    outcomes: list[StepOutcome | None] = []
    pending = 0
    for batch_idx, batch in enumerate(batches):
        with pair.context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            losses.append(pair.step(pair.sgd, pair.model.a, batch, schedule[batch_idx]))
            outcomes.append(pair.sgd.last_outcome)
            pending += 1
            closes = _closes(schedule, batch_idx)
            expected += [("before_backward", "sgd"), ("after_backward", "sgd")]
            expected += [("before_optimizer_step", "sgd")] if closes else []
            expected += [("after_step", "sgd")]
            pending = 0 if closes else pending
            if batch_idx % 2 == 0:
                losses.append(pair.step(pair.adam, pair.model.b, batch, True))
                outcomes.append(pair.adam.last_outcome)
                expected += [("before_backward", "adam"), ("after_backward", "adam")]
                expected += [("before_optimizer_step", "adam"), ("after_step", "adam")]
    events = recorder.events
    assert [(e.kind, e.wrapper) for e in events] == expected, "the hooks ran in another order or number"
    _assert_backward_hooks_surround_autograd(events, losses)
    assert [e.outcome for e in events if e.kind == "after_step"] == outcomes, "after_step's outcome is last_outcome"

    plain = _plain_loop(pair, batches, schedule, settings)
    _assert_steps_saw_what_they_apply(events, plain, cell)
    closing = [e.outcome for e in events if e.kind == "after_step" and e.outcome is not A]
    assert closing == [outcome for _, _, outcome in plain], "a real step's outcome differs from the plain loop's"
    if cell.precision == "16-mixed":
        assert K in closing and S in closing, "the planted overflow was meant to skip some steps, not all"
    assert_params_close(pair.model, pair.oracle, cell, "two wrappers with hooks registered")


class _Boom(Exception):
    """A hook's planted failure."""


def _boom(*args: Any) -> None:
    raise _Boom


def _removed_and_refused_hooks_do_not_run(pair: _Pair, batch: Batch) -> None:
    """A removed hook and one registered with a refused one never run; a raising ``after_step`` leaves the step."""
    recorder = Recorder(pair.names)
    recorder.register(pair.context).remove()
    with refuses(
        TypeError,
        "context.register_hooks(after_step=..., before_backward=3)",
        "HOOK-004: a hook that is not callable is refused with TypeError when it is registered",
    ):
        pair.context.register_hooks(after_step=recorder.after_step, before_backward=3)  # type: ignore[arg-type]
    after = pair.context.register_hooks(after_step=_boom)
    with pytest.raises(_Boom):
        pair.step(pair.sgd, pair.model.a, batch, True)
    after.remove()
    assert pair.sgd.last_outcome is not A, "the step an after_step hook raised from must stay taken"
    assert recorder.events == [], "a removed hook, or one registered with a refused one, ran"


def _refused_backward_runs_no_hook(pair: _Pair, batch: Batch) -> None:
    """A ``backward()`` refused on a prepared window runs no hook [HOOK-001]."""
    refused = Recorder(pair.names)
    handle = refused.register(pair.context)
    pair.step(pair.sgd, pair.model.a, batch, False)
    pair.sgd.unscale_gradients()
    count = len(refused.events)
    with pytest.raises(RuntimeError):
        pair.sgd.backward(mse(pair.model.a, batch, pair.device, pair.dtype))
    assert len(refused.events) == count, "a refused backward() ran hooks (HOOK-001)"
    handle.remove()


@pytest.mark.requirement("HOOK-004", "HOOK-001", "FAIL-002", "FAIL-003", "FAIL-004")
@pytest.mark.features("hooks")
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    faults=("raising hook", "invalid argument"),
    make_optimizer_step=("True", "False"),
    on_failure=("discard", "restore"),
    wrappers=("2",),
)
def test_a_raising_hook_fails_the_call_as_a_raising_closure_does(
    make_context: MakeContext, cell: Cell, on_failure: str
) -> None:
    """A hook that raises fails the call before the step as a raising closure would, and only that call.

    ``before_backward`` raising (before the call's first backward): nothing changes, under either policy.
    ``before_optimizer_step`` raising (the window written and prepared): under ``"restore"`` nothing changes; under
    ``"discard"`` the window is gone (``DISCARDED``, a note on the exception) and the loss scaler has forgotten its
    unscaling, so the next window steps on its own mean, unscaled once. The other wrapper is untouched throughout.
    ``after_step`` raising: the step stays taken. Removed and refused hooks do not run; a refused ``backward()`` runs
    no hook. The retries give the plain loop's result.
    """
    settings = GradScalerSettings() if cell.precision == "16-mixed" else None
    discard = on_failure == "discard"
    pair = _Pair(make_context, cell, grad_scaler=settings, **failure_settings(on_failure))
    batches = make_batches(3, seed=17)

    # One accumulated micro-step first, so that the failing calls have a window to leave as it was.
    pair.step(pair.sgd, pair.model.a, batches[0], False)
    pair.step(pair.adam, pair.model.b, batches[0], False)
    window, other = grads(pair.model.a.parameters()), grads(pair.model.b.parameters())
    values = param_values(pair.model.parameters())
    for kind, make in (("before_backward", False), ("before_backward", True), ("before_optimizer_step", True)):
        handle = pair.context.register_hooks(**{kind: _boom})
        with pytest.raises(_Boom) as raised:
            pair.step(pair.sgd, pair.model.a, batches[1], make)
        handle.remove()
        what = f"a raising {kind} hook (on_failure={on_failure!r})"
        assert_same_grads(
            grads(pair.model.b.parameters()), other, f"{what} changed the other wrapper's window (FAIL-002)"
        )
        assert pair.adam.last_outcome is A, f"{what} changed the other wrapper's last_outcome"
        assert_same_values(param_values(pair.model.parameters()), values, what)
        if discard and kind == "before_optimizer_step":
            assert_same_grads(
                grads(pair.model.a.parameters()),
                [None] * len(window),
                f"{what} after the window's backward: its gradients survived the discard (FAIL-003)",
            )
            assert pair.sgd.last_outcome is StepOutcome.DISCARDED, f"{what}: last_outcome {pair.sgd.last_outcome}"
            assert_discard_note(raised.value, pair.sgd.optimizer, (1, 2), what)
            continue
        assert_same_grads(grads(pair.model.a.parameters()), window, f"{what} left the window changed (HOOK-004)")
        assert pair.sgd.last_outcome is A, f"{what} changed last_outcome"

    _removed_and_refused_hooks_do_not_run(pair, batches[1])

    oracle_sgd = torch.optim.SGD(pair.oracle.a.parameters(), lr=0.1, momentum=0.9)
    scaler = plain_scaler(cell, GradScalerSettings())
    window_batches = batches[1:2] if discard else batches[:2]  # under "discard" batch 0 went with the window
    for batch in window_batches:
        scaled_backward(oracle_loss(pair.oracle.a, batch, cell, factor=1.0), scaler)
    real_step(oracle_sgd, len(window_batches), scaler)
    update_scaler(scaler)
    oracle_step_done(cell)
    assert_params_close(pair.model.a, pair.oracle.a, cell, f"the retry after the raising hooks ({on_failure})")

    _refused_backward_runs_no_hook(pair, batches[2])
