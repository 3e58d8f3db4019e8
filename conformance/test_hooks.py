"""Checks of the hooks a framework registers on a training context (HOOK-001 to HOOK-004).

Two wrappers over the two halves of a model (SGD with momentum on one, Adam on the other) run schedules of
windows; the hooks record what they see. The expected order of events is worked out from the schedule, the
gradients the ``before_optimizer_step`` hook sees come from a plain-PyTorch loop (the window's mean, unscaled under
16-mixed, one ``GradScaler`` for both optimizers updated once per batch), and each ``after_step`` outcome of a real
step is the plain loop's (skipped where its unscaled gradients are not finite).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import partial
from typing import Any, NamedTuple

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_same_grads, assert_same_values, grads, param_values
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    Batch,
    Halves,
    PlannedFailure,
    adam_eps,
    assert_discard_note,
    assert_params_close,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    mse,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    PlainWindows,
    oracle_loss,
    params_of,
    plain_scaler,
    train_windows,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, K = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE
HOOKS = ("before_backward", "after_backward", "before_optimizer_step", "after_step")
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


class Event(NamedTuple):
    """One hook call: which hook, for which wrapper, its argument (the loss or the outcome), the gradients it saw."""

    kind: str
    wrapper: str
    argument: Any
    grads: list[torch.Tensor]


class _Pair:
    """The two wrappers over a ``Halves`` model in a context, its plain copy, and the hooks' record of events."""

    def __init__(self, make_context: MakeContext, cell: Cell, **settings: Any) -> None:
        self.cell, self.context, base, self.events = cell, make_context(**settings), Halves(51, 52), list[Event]()
        model, oracle = self.context.prepare_module(base), oracle_copy(base, cell)
        assert isinstance(model, Halves) and isinstance(oracle, Halves)
        self.model, self.oracle = model, oracle
        self.sgd = self.context.wrap(torch.optim.SGD(self.model.a.parameters(), lr=0.1, momentum=0.9))
        self.adam = self.context.wrap(torch.optim.Adam(self.model.b.parameters(), lr=0.01, eps=adam_eps(cell)))
        self.names = {id(self.sgd.optimizer): "sgd", id(self.adam.optimizer): "adam"}
        self.hooks = {kind: partial(self._record, kind) for kind in HOOKS}
        """Hooks that record each call in ``events``, naming the wrapper by its inner optimizer."""

    def _record(self, kind: str, wrapper: Any, argument: Any = None) -> None:
        held = [] if kind == "after_step" else grads(params_of(wrapper.optimizer))
        name = self.names[id(wrapper.optimizer)]
        self.events.append(Event(kind, name, argument, [grad for grad in held if grad is not None]))

    def step(self, name: str, batch: Batch, make: bool | None) -> torch.Tensor:
        """One ``step(closure)`` of wrapper ``name`` on its half; returns the loss the closure backpropagated."""
        wrapper, half = (self.sgd, self.model.a) if name == "sgd" else (self.adam, self.model.b)
        losses: list[torch.Tensor] = []

        def closure() -> torch.Tensor:
            with self.context.autocast():
                losses.append(mse(half, batch, cell_device(self.cell), cell_dtype(self.cell)))
            wrapper.backward(losses[0])
            return losses[0]

        wrapper.step(closure, make_optimizer_step=make)
        return losses[0]


def _boom(*args: Any) -> None:
    raise PlannedFailure("a hook fails (planted by the check)")


def _plain_loop(
    pair: _Pair, batches: Sequence[Batch], schedule: Sequence[bool | None], settings: GradScalerSettings | None
) -> tuple[list[tuple[str, str]], list[Event]]:
    """The hooks' calls the schedule gives, and each real step of the plain loop: what it applies, its outcome.

    One scaler, updated once per batch after its steps [AMP-003], an open window following the scale [AMP-006].
    """
    a, b = pair.oracle.a, pair.oracle.b
    optimizers = [
        torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9),
        torch.optim.Adam(b.parameters(), lr=0.01, eps=adam_eps(pair.cell)),
    ]
    loop = PlainWindows(pair.cell, optimizers, plain_scaler(pair.cell, settings))
    expected: list[tuple[str, str]] = []
    applied: list[Event] = []
    prepared: list[list[torch.Tensor | None]] = []
    for batch_idx, batch in enumerate(batches):
        make = schedule[batch_idx]
        closes = (batch_idx + 1) % 2 == 0 or batch_idx == len(batches) - 1 if make is None else make
        calls = [("sgd", a, closes), ("adam", b, True)][: 2 - batch_idx % 2]  # Adam steps on even batches
        for index, (name, half, steps) in enumerate(calls):
            loop.backward(index, oracle_loss(half, batch, pair.cell, factor=1.0))
            expected += [(kind, name) for kind in HOOKS if steps or kind != "before_optimizer_step"]
            if steps:  # the plain step, seen right before ``step``: unscaled; skipped where not finite
                finite = loop.step(index, after_prepare=lambda ps: prepared.append(grads(ps)))
                held = [grad for grad in prepared.pop() if grad is not None]
                applied.append(Event("before_optimizer_step", name, S if finite else K, held))
        loop.update()
    return expected, applied


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
    pair.context.register_hooks(**pair.hooks)
    batches = make_batches(len(schedule), seed=13)
    if cell.precision == "16-mixed":
        x, y = batches[OVERFLOWING_BATCH]
        batches[OVERFLOWING_BATCH] = (x * OVERFLOW, y)
    losses, outcomes = [], []
    for batch_idx, batch in enumerate(batches):
        with pair.context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            for name, make in [("sgd", schedule[batch_idx]), ("adam", True)][: 2 - batch_idx % 2]:
                losses.append(pair.step(name, batch, make))
                outcomes.append((pair.sgd if name == "sgd" else pair.adam).last_outcome)
    events, (expected, plain) = pair.events, _plain_loop(pair, batches, schedule, settings)
    assert [(e.kind, e.wrapper) for e in events] == expected, "the hooks ran in another order or number"
    backwards = ([e for e in events if e.kind == kind] for kind in HOOKS[:2])
    for i, (before, after, loss) in enumerate(zip(*backwards, losses, strict=True)):
        assert before.argument is loss and after.argument is loss, "a backward hook got another loss"
        unchanged = len(before.grads) == len(after.grads) and all(map(torch.equal, before.grads, after.grads))
        assert not unchanged, f"backward {i}: the gradients were the same in both hooks (autograd ran outside them)"
    assert [e.argument for e in events if e.kind == "after_step"] == outcomes, "after_step's outcome is last_outcome"
    seen, tol = [e for e in events if e.kind == "before_optimizer_step"], tolerance_for(cell)
    assert [(e.wrapper, len(e.grads)) for e in seen] == [(e.wrapper, len(e.grads)) for e in plain]
    for i, (event, want) in enumerate(zip(seen, plain, strict=True)):
        assert all(
            torch.allclose(got.cpu().double(), grad.cpu().double(), rtol=tol.rtol, atol=tol.atol, equal_nan=True)
            for got, grad in zip(event.grads, want.grads, strict=True)
        ), f"real step {i} ({want.wrapper}): before_optimizer_step saw other gradients than the step applies"
    closing = [e.argument for e in events if e.kind == "after_step" and e.argument is not A]
    assert closing == [e.argument for e in plain], "a real step's outcome differs from the plain loop's"
    if cell.precision == "16-mixed":
        assert K in closing and S in closing, "the planted overflow was meant to skip some steps, not all"
    assert_params_close(pair.model, pair.oracle, cell, "two wrappers with hooks registered")


def _removed_refused_and_after_step_hooks(pair: _Pair, batches: list[Batch]) -> None:
    """Removed and refused hooks never run, nor any on a refused ``backward()``; a raising ``after_step`` keeps a step.

    A hook registered with a refused one never runs [HOOK-004]; a ``backward()`` refused on a prepared window runs
    no hook [HOOK-001].
    """
    pair.context.register_hooks(**pair.hooks).remove()
    why = "HOOK-004: a hook that is not callable is refused with TypeError when it is registered"
    with refuses(TypeError, "context.register_hooks(after_step=..., before_backward=3)", why):
        pair.context.register_hooks(after_step=pair.hooks["after_step"], before_backward=3)  # type: ignore[arg-type]
    after = pair.context.register_hooks(after_step=_boom)
    with pytest.raises(PlannedFailure):
        pair.step("sgd", batches[1], True)
    after.remove()
    assert pair.sgd.last_outcome is not A, "the step an after_step hook raised from must stay taken"
    assert pair.events == [], "a removed hook, or one registered with a refused one, ran"
    handle = pair.context.register_hooks(**pair.hooks)
    pair.step("sgd", batches[2], False)
    pair.sgd.unscale_gradients()
    count = len(pair.events)
    with pytest.raises(RuntimeError):
        pair.sgd.backward(mse(pair.model.a, batches[2], cell_device(pair.cell), cell_dtype(pair.cell)))
    assert len(pair.events) == count, "a refused backward() ran hooks (HOOK-001)"
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
    pair.step("sgd", batches[0], False)
    pair.step("adam", batches[0], False)
    window, other = grads(pair.model.a.parameters()), grads(pair.model.b.parameters())
    values = param_values(pair.model.parameters())
    for kind, make in (("before_backward", False), ("before_backward", True), ("before_optimizer_step", True)):
        handle = pair.context.register_hooks(**{kind: _boom})
        with pytest.raises(PlannedFailure) as raised:
            pair.step("sgd", batches[1], make)
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

    _removed_refused_and_after_step_hooks(pair, batches)
    # The retry's plain loop: under "discard" batch 0 went with the window.
    oracle_sgd = torch.optim.SGD(pair.oracle.a.parameters(), lr=0.1, momentum=0.9)
    windows = [[1]] if discard else [[0, 1]]
    train_windows(cell, pair.oracle.a, oracle_sgd, batches, windows, plain_scaler(cell, settings), factor=1.0)
    assert_params_close(pair.model.a, pair.oracle.a, cell, f"the retry after the raising hooks ({on_failure})")
