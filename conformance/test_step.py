"""Checks of ``step``: when it steps, what gradient a window applies, what it returns, what it leaves behind."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_grads_close, assert_unchanged, last_outcome, snapshot
from lightning_optimizer.conformance.harness import (
    ON_FAILURE,
    REORDERED_TOLERANCES,
    assert_discard_note,
    assert_params_close,
    cell_device,
    cell_dtype,
    failure_settings,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    oracle_step_done,
    refuses,
    run_steps,
    scaler_settings,
)
from lightning_optimizer.conformance.optimizer_kinds import RecordingSGD, closure_of
from lightning_optimizer.conformance.oracles import WindowOracle, expected_outcomes, oracle_copy
from lightning_optimizer.conformance.plain_loop import plain_scaler
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED
NOT_LOSS_SCALED = ("64-true", "32-true", "bf16-true", "16-true", "bf16-mixed")
"""Precisions whose gradients are the true ones (16-mixed scales them by a scale the contract leaves open)."""


def _setup(
    make_context: MakeContext,
    cell: Cell,
    accumulate_grad_batches: int = 1,
    settings: dict[str, Any] | None = None,
    kind: type[torch.optim.SGD] = torch.optim.SGD,
    **sgd: Any,
) -> tuple[TrainingContext, torch.nn.Module, Any, WindowOracle]:
    """A context (``settings`` for the factory), its prepared model, wrapped ``kind``, and the oracle's copy.

    The oracle steps a plain SGD; under 16-mixed its GradScaler has the factory's ``grad_scaler`` settings.
    """
    context = make_context(accumulate_grad_batches=accumulate_grad_batches, **(settings or {}))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    hyper = {"lr": 0.1, "momentum": 0.9} | sgd
    oracle = WindowOracle(
        oracle_model, torch.optim.SGD(oracle_model.parameters(), **hyper), cell, accumulate_grad_batches
    )
    oracle.scaler = plain_scaler(cell, (settings or {}).get("grad_scaler"))
    return context, model, context.wrap(kind(model.parameters(), **hyper)), oracle


@pytest.mark.requirement("STEP-001", "STEP-004")
@pytest.mark.varies(
    window=("1 micro-step", "cut short by True"), make_optimizer_step=("True",), optimizer=("SGD momentum",)
)
def test_true_steps_now(make_context: MakeContext, cell: Cell) -> None:
    """``make_optimizer_step=True`` steps on every call, even when the schedule would accumulate."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=4)
    batches = make_batches(3)
    outcomes = run_steps(context, model, wrapper, batches, cell, lambda i: True)
    oracle.train_windows(batches, [[0], [1], [2]])
    assert outcomes == expected_outcomes([S, S, S], oracle.stepped), (
        f"make_optimizer_step=True must step every time; outcomes were {outcomes}"
    )
    assert_params_close(model, oracle.model, cell, "three steps with make_optimizer_step=True")


@pytest.mark.requirement("STEP-002", "STEP-004")
@pytest.mark.varies(make_optimizer_step=("False",), window=("k >= 2 micro-steps",), optimizer=("Adam",))
def test_false_accumulates_only(make_context: MakeContext, cell: Cell) -> None:
    """``make_optimizer_step=False`` changes no parameter and no optimizer state; gradients add up."""
    context = make_context()
    base = make_model()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    batches = make_batches(2)
    outcomes = run_steps(context, model, wrapper, batches, cell, lambda i: False)
    assert outcomes == [A, A], f"make_optimizer_step=False must accumulate; outcomes were {outcomes}"
    for param, old in zip(model.parameters(), before, strict=True):
        assert torch.equal(param.detach(), old), "a parameter changed on make_optimizer_step=False"
    assert len(wrapper.optimizer.state) == 0, "the inner optimizer's state changed on make_optimizer_step=False"
    if cell.precision == "16-mixed":
        return  # the gradients are scaled by the implementation's loss scale, which the contract leaves open
    device, dtype = cell_device(cell), cell_dtype(cell)
    for batch in batches:
        with oracle_autocast(cell):
            loss = mse(oracle, batch, device, dtype)
        loss.backward()
    for (name, got), want in zip(model.named_parameters(), oracle.parameters(), strict=True):
        assert got.grad is not None, f"{name}: no gradient after two accumulated micro-steps"
        assert want.grad is not None
        torch.testing.assert_close(got.grad, want.grad, msg=f"{name}: the accumulated gradient is not the sum")


@pytest.mark.requirement("STEP-003", "ACC-001", "ACC-003")
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "partial, flushed by the last batch"),
    make_optimizer_step=("None",),
    position=("inside batch()",),
)
def test_schedule_flushes_last_partial_window(make_context: MakeContext, cell: Cell) -> None:
    """``accumulate_grad_batches=3`` over two epochs of 10 batches: windows 3, 3, 3, 1 in each epoch."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=3)
    batches = make_batches(10)
    windows = [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    for epoch in range(2):
        outcomes = run_steps(context, model, wrapper, batches, cell)
        oracle.train_windows(batches, windows)
        expected = expected_outcomes([A, A, S, A, A, S, A, A, S, S], oracle.stepped[4 * epoch :])
        assert outcomes == expected, f"epoch {epoch}: outcomes were {outcomes}"
        assert_params_close(model, oracle.model, cell, f"end of epoch {epoch}")


@pytest.mark.requirement("STEP-003")
@pytest.mark.varies(window=("k >= 2 micro-steps",), make_optimizer_step=("None",), position=("outside batch()",))
def test_schedule_outside_a_batch_counts_micro_steps(make_context: MakeContext, cell: Cell) -> None:
    """Without ``context.batch``, ``make_optimizer_step=None`` steps when the window is full."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=2)
    batches = make_batches(4)
    device, dtype = cell_device(cell), cell_dtype(cell)
    outcomes = []
    for batch in batches:

        def closure(batch: Any = batch) -> torch.Tensor:
            with context.autocast():
                loss = mse(model, batch, device, dtype)
            wrapper.backward(loss)
            return loss

        wrapper.step(closure)
        outcomes.append(wrapper.last_outcome)
    oracle.train_windows(batches, [[0, 1], [2, 3]])
    assert outcomes == expected_outcomes([A, S, A, S], oracle.stepped), f"outcomes were {outcomes}"
    assert_params_close(model, oracle.model, cell, "two windows of two micro-steps outside context.batch")


@pytest.mark.requirement("ACC-001")
@pytest.mark.cells(precisions=NOT_LOSS_SCALED)
@pytest.mark.varies(window=("k >= 2 micro-steps",), optimizer=("SGD",))
def test_window_equals_concatenated_batch(make_context: MakeContext, cell: Cell) -> None:
    """Three equal micro-batches accumulated equal one step on their concatenation with a mean loss."""
    context, model, wrapper, oracle = _setup(make_context, cell, momentum=0.0)
    batches = make_batches(3)
    run_steps(context, model, wrapper, batches, cell, lambda i: i == 2)
    whole = (torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches]))
    oracle.optimizer.zero_grad()
    with oracle_autocast(cell):
        loss = mse(oracle.model, whole, cell_device(cell), cell_dtype(cell))
    loss.backward()
    oracle.optimizer.step()
    assert_params_close(
        model, oracle.model, cell, "three micro-batches vs their concatenation", REORDERED_TOLERANCES[cell.precision]
    )


@pytest.mark.requirement("ACC-001", "STEP-001")
@pytest.mark.varies(window=("k >= 2 micro-steps", "cut short by True"), make_optimizer_step=("True", "None"))
def test_window_cut_short_applies_its_own_mean(make_context: MakeContext, cell: Cell) -> None:
    """With ``accumulate_grad_batches=4``, ``True`` after two micro-steps applies the mean of two."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=4)
    batches = make_batches(6)
    schedule: dict[int, bool | None] = {1: True}
    outcomes = run_steps(context, model, wrapper, batches, cell, schedule.get)
    oracle.train_windows(batches, [[0, 1], [2, 3], [4, 5]])
    assert outcomes == expected_outcomes([A, S, A, S, A, S], oracle.stepped), f"outcomes were {outcomes}"
    assert_params_close(model, oracle.model, cell, "a window cut short by make_optimizer_step=True")


@pytest.mark.requirement("ACC-002")
@pytest.mark.cells(precisions=NOT_LOSS_SCALED)
@pytest.mark.varies(
    call_form=("closure, loss.backward",), window=("k >= 2 micro-steps", "partial, flushed by the last batch")
)
def test_plain_backward_gives_the_same_mean(make_context: MakeContext, cell: Cell) -> None:
    """Closures that call ``loss.backward()`` instead of ``wrapper.backward(loss)`` give the same steps."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=3)
    batches = make_batches(5)
    run_steps(context, model, wrapper, batches, cell, plain_backward=True)
    oracle.train_windows(batches, [[0, 1, 2], [3, 4]])
    assert_params_close(model, oracle.model, cell, "closures calling loss.backward() directly")


@pytest.mark.requirement("STEP-005")
@pytest.mark.varies(step_kwargs=("without gradients",), window=("k >= 2 micro-steps",))
def test_kwargs_reach_the_inner_step(make_context: MakeContext, cell: Cell) -> None:
    """Keyword arguments of ``step`` reach the inner optimizer's ``step`` on a real step."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    inner = RecordingSGD(model.parameters(), lr=0.1)
    wrapper = context.wrap(inner)
    for batch_idx in range(2):
        with context.batch(batch_idx):
            wrapper.step(lambda: None, scale=batch_idx)
    assert inner.calls == [{"scale": 1}], f"the inner step received {inner.calls}, expected [{{'scale': 1}}]"


@pytest.mark.requirement("STEP-006")
@pytest.mark.varies(make_optimizer_step=("False", "True"), step_kwargs=("without gradients",))
def test_step_returns_the_closure_result(make_context: MakeContext, cell: Cell) -> None:
    """``step`` returns the closure's own result on accumulating and on real steps, ``None`` without one."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    marker = object()
    assert wrapper.step(lambda: marker, make_optimizer_step=False) is marker
    assert wrapper.step(lambda: marker, make_optimizer_step=True) is marker
    assert wrapper.step() is None


@pytest.mark.requirement("ZERO-001")
@pytest.mark.varies(window=("k >= 2 micro-steps",), make_optimizer_step=("None",))
def test_real_step_clears_gradients(make_context: MakeContext, cell: Cell) -> None:
    """After a real step every gradient of the wrapper's parameters is ``None``."""
    context, model, wrapper, _ = _setup(make_context, cell, accumulate_grad_batches=2)
    run_steps(context, model, wrapper, make_batches(2), cell)
    assert wrapper.last_outcome in (S, StepOutcome.SKIPPED_NON_FINITE), f"no real step: {wrapper.last_outcome}"
    assert all(p.grad is None for p in model.parameters()), "gradients survived a real step"


@pytest.mark.requirement("ZERO-002", "ACC-001")
@pytest.mark.varies(
    zero_grad=("set_to_none=True", "set_to_none=False", "with a window open"), call_form=("backward, then step()",)
)
def test_zero_grad_keeps_an_open_window(make_context: MakeContext, cell: Cell) -> None:
    """The ``zero_grad(); backward(); step()`` loop accumulates correctly; with no window open it clears."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=2)
    batches = make_batches(4)
    device, dtype = cell_device(cell), cell_dtype(cell)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == 3):
            wrapper.zero_grad()
            with context.autocast():
                loss = mse(model, batch, device, dtype)
            wrapper.backward(loss)
            wrapper.step()
    oracle.train_windows(batches, [[0, 1], [2, 3]])
    assert_params_close(model, oracle.model, cell, "zero_grad(); backward(); step() with accumulate_grad_batches=2")
    with context.autocast():
        loss = mse(model, batches[0], device, dtype)
    wrapper.backward(loss)
    wrapper.zero_grad(set_to_none=False)
    grads = [p.grad for p in model.parameters()]
    assert all(g is not None and not g.any() for g in grads), "zero_grad(set_to_none=False) with no open window"


@pytest.mark.requirement("CLOS-001")
@pytest.mark.varies(window=("k >= 2 micro-steps",), make_optimizer_step=("None",))
def test_closure_runs_once_per_call(make_context: MakeContext, cell: Cell) -> None:
    """The closure runs exactly once per ``step`` call, accumulating or stepping."""
    context, model, wrapper, _ = _setup(make_context, cell, accumulate_grad_batches=2)
    device, dtype = cell_device(cell), cell_dtype(cell)
    calls = []
    batches = make_batches(4)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == 3):

            def closure(batch: Any = batch, batch_idx: int = batch_idx) -> torch.Tensor:
                calls.append(batch_idx)
                with context.autocast():
                    loss = mse(model, batch, device, dtype)
                wrapper.backward(loss)
                return loss

            wrapper.step(closure)
    assert calls == [0, 1, 2, 3], f"closure calls per batch: {calls}"


@pytest.mark.requirement("CLOS-003", "TOGGLE-002", "FAIL-002", "FAIL-003", "FAIL-004")
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(
    faults=("raising closure", "raising closure after its backward"),
    make_optimizer_step=("True", "False", "None"),
    window=("k >= 2 micro-steps",),
    on_failure=("discard", "restore"),
)
def test_closure_that_raises_changes_nothing(make_context: MakeContext, cell: Cell, on_failure: str) -> None:
    """A closure that raises, on a closing or an accumulating micro-step: the window as the failure policy leaves it.

    Raised before its backward, the window is as it was under either policy (FAIL-002). Raised after its backward,
    it is as it was under ``"restore"`` (FAIL-004); under ``"discard"`` it is gone: every gradient ``None``,
    ``last_outcome`` ``DISCARDED``, the exception's note naming the optimizer (FAIL-003), and the calls that follow
    make new windows. Parameters and flags never change; training then matches the plain loop over the windows
    each policy leaves.
    """
    context, model, wrapper, oracle = _setup(make_context, cell, 2, failure_settings(on_failure))
    discard, batches = on_failure == "discard", make_batches(4)

    def failing() -> None:
        raise RuntimeError("boom from the closure")

    def failing_after_backward() -> None:
        closure_of(context, wrapper, model, batches[3], cell)()
        failing()

    wrapper.step(closure_of(context, wrapper, model, batches[0], cell))
    before, held = snapshot(model), 1
    for raising in (failing, failing_after_backward):
        for make_step in (True, None, False):
            outcome = wrapper.last_outcome
            with refuses(
                RuntimeError,
                f"wrapper.step({raising.__name__}, make_optimizer_step={make_step}) whose closure raises",
                "CLOS-003: a closure's exception propagates out of step()",
                match="boom from the closure",
            ) as raised:
                wrapper.step(raising, make_optimizer_step=make_step)
            what = f"after a closure raised ({raising.__name__}, make_optimizer_step={make_step}, {on_failure=})"
            if discard and raising is failing_after_backward:
                # A call that fails after its backward wrote into the window discards it (FAIL-003).
                assert_unchanged(model, replace(before, grads=[None] * len(before.grads)), what)
                assert wrapper.last_outcome is StepOutcome.DISCARDED, (
                    f"{what}: last_outcome is {wrapper.last_outcome}, expected DISCARDED (FAIL-003)"
                )
                assert_discard_note(raised.value, wrapper.optimizer, (held, held + 1), what)
                held = 0
                continue
            assert_unchanged(model, before, what)
            assert wrapper.last_outcome is outcome, (
                f"{what}: last_outcome changed from {outcome} to {last_outcome(wrapper)}"
            )
    # Under "discard" the window of batch 0 is gone: the next calls make the windows [1, 2] and [3, 0].
    order, windows = ((1, 2, 3, 0), [[1, 2], [3, 0]]) if discard else ((1, 2, 3), [[0, 1], [2, 3]])
    for batch_idx in order:
        wrapper.step(closure_of(context, wrapper, model, batches[batch_idx], cell))
    assert wrapper.last_outcome is S, f"the window {windows[-1]} did not close on time: {wrapper.last_outcome}"
    oracle.train_windows(batches, windows)
    assert_params_close(model, oracle.model, cell, f"training after a closure raised mid-window ({on_failure=})")


@pytest.mark.requirement("BWD-001")
@pytest.mark.cells(precisions=NOT_LOSS_SCALED)
@pytest.mark.varies(backward_args=("retain_graph", "inputs"))
def test_backward_forwards_its_arguments(make_context: MakeContext, cell: Cell) -> None:
    """``backward`` forwards ``retain_graph`` and ``inputs`` as ``loss.backward`` would."""
    context, model, wrapper, oracle = _setup(make_context, cell)
    device, dtype = cell_device(cell), cell_dtype(cell)
    batch = make_batches(1)[0]
    first = next(iter(model.parameters()))
    with context.autocast():
        loss = mse(model, batch, device, dtype)
    wrapper.backward(loss, retain_graph=True, inputs=[first])
    wrapper.backward(loss, inputs=[first])  # needs the retained graph
    assert all(p.grad is None for p in list(model.parameters())[1:]), "inputs=[...] was not forwarded"
    with oracle_autocast(cell):
        oracle_loss = mse(oracle.model, batch, device, dtype)
    oracle_loss.backward()
    want = next(iter(oracle.model.parameters())).grad
    assert first.grad is not None and want is not None
    torch.testing.assert_close(first.grad, 2 * want, msg="two backward passes through a retained graph")


SCALER_SETTINGS = GradScalerSettings(init_scale=2.0**10)
"""The loss scaler that the checks below ask for under 16-mixed: at this scale the small model's float16 gradients
stay finite, so every real step is taken; their oracles build a plain ``GradScaler`` with the same settings."""


Backward = Callable[..., None]
LossOf = Callable[[bool], torch.Tensor]
"""Computes the check's loss on one model: per element (``True``) or its mean (``False``)."""


def _twice(backward: Backward, loss: torch.Tensor, *first: Any, **first_kwargs: Any) -> None:
    backward(loss, *first, **first_kwargs)
    backward(loss)  # needs the graph that the first call retained


def _squared_error(
    net: torch.nn.Module, autocast: Callable[[], Any], x: torch.Tensor, y: torch.Tensor, per_element: bool
) -> torch.Tensor:
    """The squared error of ``net`` on ``(x, y)``, its forward under ``autocast()``: per element or its mean."""
    with autocast():
        squared: torch.Tensor = (net(x).to(y.dtype) - y) ** 2
    return squared if per_element else squared.mean()


BACKWARD_FORMS: dict[str, Callable[[Backward, list[torch.Tensor], LossOf, torch.Tensor], None]] = {
    "(per_element_loss, gradient)": lambda bw, params, loss, gradient: bw(loss(True), gradient),
    "(per_element_loss, gradient=gradient)": lambda bw, params, loss, gradient: bw(loss(True), gradient=gradient),
    "(loss, retain_graph=True) then (loss)": lambda bw, params, loss, _: _twice(bw, loss(False), retain_graph=True),
    "(loss, None, True) then (loss)": lambda bw, params, loss, _: _twice(bw, loss(False), None, True),
    "(loss, create_graph=True)": lambda bw, params, loss, _: bw(loss(False), create_graph=True),
    "(loss, inputs=[first parameter])": lambda bw, params, loss, _: bw(loss(False), inputs=[params[0]]),
    "(loss, None, None, False, [last parameter])": lambda bw, params, loss, _: bw(
        loss(False), None, None, False, [params[-1]]
    ),
}
"""Each call form of ``backward``, by how it reads, as a function of (backward, parameters, loss, gradient)."""


@pytest.mark.requirement("BWD-001")
@pytest.mark.varies(
    backward_args=("gradient", "retain_graph", "create_graph", "inputs", "positional", "graph freed"),
    loss_scale=("initial", "settings given to the factory"),
)
@pytest.mark.filterwarnings("ignore:Using backward\\(\\) with create_graph=True")  # torch: a reference cycle
def test_backward_call_forms(make_context: MakeContext, cell: Cell) -> None:
    """``w.backward`` does what ``loss.backward`` does in every call form, after scaling the loss under 16-mixed."""
    context, model, wrapper, oracle = _setup(make_context, cell, 1, scaler_settings(cell, SCALER_SETTINGS), momentum=0)
    scaler, scale = oracle.scaler, 1.0 if oracle.scaler is None else SCALER_SETTINGS.init_scale
    device, dtype = cell_device(cell), cell_dtype(cell)
    x, y = (t.to(device=device, dtype=dtype) for t in make_batches(1)[0])
    gradient = torch.randn(y.shape, generator=torch.Generator().manual_seed(5)).to(device=device, dtype=dtype)
    autocast = partial(oracle_autocast, cell)

    def oracle_backward(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        (loss if scaler is None else scaler.scale(loss)).backward(*args, **kwargs)

    sides: list[tuple[str, Backward, torch.nn.Module, LossOf]] = [
        ("wrapper.backward", wrapper.backward, model, partial(_squared_error, model, context.autocast, x, y)),
        (
            "the oracle's loss.backward",
            oracle_backward,
            oracle.model,
            partial(_squared_error, oracle.model, autocast, x, y),
        ),
    ]
    results: list[tuple[str, list[Any], list[Any]]] = []
    for form, run in BACKWARD_FORMS.items():
        for who, backward, net, loss_fn in sides:
            try:
                run(backward, list(net.parameters()), loss_fn, gradient)
            except Exception as exc:
                raise AssertionError(f"{who}{form} raised {exc!r}, where loss.backward{form} runs") from exc
        results.append((form, [p.grad for p in model.parameters()], [p.grad for p in oracle.model.parameters()]))
        model.zero_grad(set_to_none=True)
        oracle.model.zero_grad(set_to_none=True)
    oracle_step_done(cell)  # on XLA: every form's gradients, both sides, in one graph before they are read
    for form, got, want in results:
        what, present = f"after wrapper.backward{form}", [g is not None for g in got]
        assert present == [g is not None for g in want], (
            f"{what}: parameters with a gradient {present}, with loss.backward{form} {[g is not None for g in want]}"
        )
        pairs = [(g, w) for g, w in zip(got, want, strict=True) if g is not None and w is not None]
        assert "create_graph" not in form or all(g.requires_grad for g, _ in pairs), (
            f"{what}: a gradient has no graph of its own (create_graph lost)"
        )
        assert_grads_close(
            [g / scale for g, _ in pairs],
            [w / scale for _, w in pairs],
            cell,
            f"{what} vs loss.backward{form}, of the parameters with one",
        )
    for who, backward, net, loss_fn in sides:  # without retain_graph, the first call frees the graph
        loss = loss_fn(False)
        backward(loss)
        with refuses(RuntimeError, f"a second {who}(loss) through one graph", "BWD-001: as loss.backward() frees it"):
            backward(loss)
        net.zero_grad(set_to_none=True)


@pytest.mark.requirement("STEP-005", "STEP-006", "STEP-004")
@pytest.mark.varies(
    step_kwargs=("with gradients",),
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
    position=("inside batch()", "outside batch()"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    optimizer=("SGD momentum",),
    loss_scale=("settings given to the factory",),
)
def test_kwargs_and_result_with_gradients(make_context: MakeContext, cell: Cell) -> None:
    """With gradients: ``kwargs`` reach the inner step once per real step; ``step`` returns the closure's result."""
    settings = scaler_settings(cell, SCALER_SETTINGS)
    context, model, wrapper, oracle = _setup(make_context, cell, 2, settings, kind=RecordingSGD)
    batches = make_batches(6)
    device, dtype = cell_device(cell), cell_dtype(cell)
    outcomes = []

    def call(index: int, make_optimizer_step: bool | None = None) -> None:
        marker = f"<the result of closure {index}>"  # an object of its own that nothing else returns

        def closure() -> str:
            with context.autocast():
                loss = mse(model, batches[index], device, dtype)
            wrapper.backward(loss)
            return marker

        got = wrapper.step(closure, make_optimizer_step=make_optimizer_step, tag=index)
        assert got is marker, (
            f"micro-step {index} (make_optimizer_step={make_optimizer_step}): step returned {got!r}, not the "
            f"closure's result {marker!r}"
        )
        outcomes.append(wrapper.last_outcome)

    for batch_idx in range(3):  # windows [0, 1] and [2], the last flushed by the epoch's last batch
        with context.batch(batch_idx, is_last=batch_idx == 2):
            call(batch_idx)
    call(3, make_optimizer_step=True)  # a window of one, cut short
    call(4, make_optimizer_step=False)
    with context.autocast():
        loss = mse(model, batches[5], device, dtype)
    wrapper.backward(loss)
    got = wrapper.step(make_optimizer_step=True, tag=5)  # closes the window [4, 5]
    assert got is None, f"step() without a closure, on a real step with gradients, returned {got!r}, not None"
    outcomes.append(wrapper.last_outcome)
    oracle.train_windows(batches, [[0, 1], [2], [3], [4, 5]])
    assert all(oracle.stepped), "check precondition: the oracle's loss scaler skipped a step"
    assert outcomes == [A, S, S, S, A, S], f"outcomes were {outcomes}"
    expected = [{"tag": 1}, {"tag": 2}, {"tag": 3}, {"tag": 5}]
    assert wrapper.optimizer.calls == expected, (
        f"the inner step received {wrapper.optimizer.calls}; expected one call per real step with that step's keyword "
        f"arguments, none on accumulating micro-steps: {expected}"
    )
    assert_params_close(model, oracle.model, cell, "four real steps with keyword arguments")


AUTOCAST_DTYPES = {"16-mixed": torch.float16, "bf16-mixed": torch.bfloat16}


@pytest.mark.requirement("CLOS-001")
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "None"),
    position=("inside batch()", "outside batch()"),
)
def test_closure_runs_once_in_the_autocast_region(make_context: MakeContext, cell: Cell) -> None:
    """Each call runs its closure once, under the context's autocast, though the closure does not enter it."""
    context, model, wrapper, oracle = _setup(make_context, cell, 2, scaler_settings(cell, SCALER_SETTINGS))
    batches = make_batches(4)
    device, dtype = cell_device(cell), cell_dtype(cell)
    device_type = device.type
    seen: list[tuple[int, bool, torch.dtype]] = []

    def closure_for(index: int) -> Callable[[], torch.Tensor]:
        def closure() -> torch.Tensor:
            seen.append((index, torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type)))
            loss = mse(model, batches[index], device, dtype)  # no context.autocast(): the call's region must hold
            wrapper.backward(loss)
            return loss

        return closure

    for batch_idx in range(3):  # windows [0, 1] and [2], flushed by the epoch's last batch
        with context.batch(batch_idx, is_last=batch_idx == 2):
            wrapper.step(closure_for(batch_idx))
    wrapper.step(closure_for(3), make_optimizer_step=True)  # a window of one, outside any batch
    assert [index for index, _, _ in seen] == [0, 1, 2, 3], (
        f"closure runs, by call: {[index for index, _, _ in seen]}; expected each of the four calls to run it once"
    )
    want = AUTOCAST_DTYPES.get(cell.precision)
    for index, enabled, autocast_dtype in seen:
        if want is None:
            assert not enabled, f"call {index}: {cell.precision} ran the closure under {autocast_dtype} autocast"
        else:
            assert enabled and autocast_dtype == want, (
                f"call {index}: the closure ran "
                f"{f'under {autocast_dtype} autocast' if enabled else 'without autocast'}, expected {want} "
                f"autocast on {device_type} (the context's autocast region)"
            )
    assert not torch.is_autocast_enabled(device_type), "autocast is still enabled after step() returned"
    oracle.train_windows(batches, [[0, 1], [2], [3]])
    assert_params_close(model, oracle.model, cell, "closures without context.autocast() of their own")
