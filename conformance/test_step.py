"""Checks of ``step``: when it steps, what gradient a window applies, what it returns, what it leaves behind."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.harness import (
    REORDERED_TOLERANCES,
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    run_steps,
)
from lightning_optimizer.conformance.oracles import WindowOracle, expected_outcomes, oracle_copy
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED
NOT_LOSS_SCALED = ("64-true", "32-true", "bf16-true", "bf16-mixed")
"""Precisions whose gradients are the true ones (16-mixed scales them by a scale the contract leaves open)."""


def _setup(
    make_context: MakeContext, cell: Cell, accumulate_grad_batches: int = 1, **sgd: Any
) -> tuple[TrainingContext, torch.nn.Module, Any, WindowOracle]:
    """A context, its prepared model and wrapped SGD, and the oracle on a copy of the same model."""
    context = make_context(accumulate_grad_batches=accumulate_grad_batches)
    base = make_model()
    reference_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    hyper = {"lr": 0.1, "momentum": 0.9} | sgd
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), **hyper))
    return (
        context,
        model,
        wrapper,
        WindowOracle(reference_model, torch.optim.SGD(reference_model.parameters(), **hyper), cell),
    )


@pytest.mark.requirement("STEP-001", "STEP-004")
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
def test_plain_backward_gives_the_same_mean(make_context: MakeContext, cell: Cell) -> None:
    """Closures that call ``loss.backward()`` instead of ``wrapper.backward(loss)`` give the same steps."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=3)
    batches = make_batches(5)
    run_steps(context, model, wrapper, batches, cell, plain_backward=True)
    oracle.train_windows(batches, [[0, 1, 2], [3, 4]])
    assert_params_close(model, oracle.model, cell, "closures calling loss.backward() directly")


@pytest.mark.requirement("STEP-005")
def test_kwargs_reach_the_inner_step(make_context: MakeContext, cell: Cell) -> None:
    """Keyword arguments of ``step`` reach the inner optimizer's ``step`` on a real step."""

    class RecordingSGD(torch.optim.SGD):
        calls: list[dict[str, Any]]

        def step(self, closure: Any = None, **kwargs: Any) -> Any:
            self.calls.append(kwargs)
            return super().step(closure)

    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    inner = RecordingSGD(model.parameters(), lr=0.1)
    inner.calls = []
    wrapper = context.wrap(inner)
    for batch_idx in range(2):
        with context.batch(batch_idx):
            wrapper.step(lambda: None, scale=batch_idx)
    assert inner.calls == [{"scale": 1}], f"the inner step received {inner.calls}, expected [{{'scale': 1}}]"


@pytest.mark.requirement("STEP-006")
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
def test_real_step_clears_gradients(make_context: MakeContext, cell: Cell) -> None:
    """After a real step every gradient of the wrapper's parameters is ``None``."""
    context, model, wrapper, _ = _setup(make_context, cell, accumulate_grad_batches=2)
    run_steps(context, model, wrapper, make_batches(2), cell)
    assert wrapper.last_outcome in (S, StepOutcome.SKIPPED_NON_FINITE), f"no real step: {wrapper.last_outcome}"
    assert all(p.grad is None for p in model.parameters()), "gradients survived a real step"


@pytest.mark.requirement("ZERO-002", "ACC-001")
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


@pytest.mark.requirement("CLOS-003", "TOGGLE-002")
def test_closure_that_raises_changes_nothing(make_context: MakeContext, cell: Cell) -> None:
    """A closure that raises, on a closing or an accumulating micro-step, leaves the window as it was."""
    context, model, wrapper, oracle = _setup(make_context, cell, accumulate_grad_batches=2)
    batches = make_batches(4)
    device, dtype = cell_device(cell), cell_dtype(cell)

    def closure_for(batch: Any) -> Callable[[], torch.Tensor]:
        def closure() -> torch.Tensor:
            with context.autocast():
                loss = mse(model, batch, device, dtype)
            wrapper.backward(loss)
            return loss

        return closure

    def failing() -> None:
        raise RuntimeError("boom from the closure")

    def failing_after_backward() -> None:
        with context.autocast():
            loss = mse(model, batches[3], device, dtype)
        wrapper.backward(loss)
        raise RuntimeError("boom from the closure")

    wrapper.step(closure_for(batches[0]))
    params_before = [p.detach().clone() for p in model.parameters()]
    flags_before = [p.requires_grad for p in model.parameters()]
    grads_before = [None if p.grad is None else p.grad.detach().clone() for p in model.parameters()]
    for raising in (failing, failing_after_backward):
        for make_step in (True, None, False):
            with pytest.raises(RuntimeError, match="boom from the closure"):
                wrapper.step(raising, make_optimizer_step=make_step)
            what = f"after a closure raised ({raising.__name__}, make_optimizer_step={make_step})"
            assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), params_before, strict=True)), (
                f"{what}: a parameter changed"
            )
            assert [p.requires_grad for p in model.parameters()] == flags_before, f"{what}: flags not restored"
            for i, (param, grad) in enumerate(zip(model.parameters(), grads_before, strict=True)):
                same = param.grad is None if grad is None else param.grad is not None and torch.equal(param.grad, grad)
                assert same, f"{what}: the window's gradient of parameter {i} is not what it was before the call"
    wrapper.step(closure_for(batches[1]))
    wrapper.step(closure_for(batches[2]))
    wrapper.step(closure_for(batches[3]))
    oracle.train_windows(batches, [[0, 1], [2, 3]])
    assert_params_close(model, oracle.model, cell, "training after a closure raised mid-window")


@pytest.mark.requirement("CLOS-002", "STEP-006")
@pytest.mark.features("closure_evaluating_optimizers")
# LBFGS's data-dependent loop recompiles on every evaluation under XLA (minutes per cell): eager devices only.
@pytest.mark.cells(devices=("cpu", "cuda"), precisions=("64-true", "32-true"))
def test_lbfgs_evaluates_the_closure_itself(make_context: MakeContext, cell: Cell) -> None:
    """LBFGS steps as a bare LBFGS does with the same closure, and returns what LBFGS returns."""
    context = make_context()
    base = make_model()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=5))
    oracle_opt = torch.optim.LBFGS(oracle.parameters(), lr=0.5, max_iter=5)
    batch = make_batches(1)[0]
    device, dtype = cell_device(cell), cell_dtype(cell)
    evaluations = []

    def closure() -> torch.Tensor:
        evaluations.append(1)
        wrapper.zero_grad()
        loss = mse(model, batch, device, dtype)
        wrapper.backward(loss)
        return loss

    def oracle_closure() -> torch.Tensor:
        oracle_opt.zero_grad()
        loss = mse(oracle, batch, device, dtype)
        loss.backward()
        return loss

    for _ in range(2):
        got = wrapper.step(closure)
        want = oracle_opt.step(oracle_closure)
        torch.testing.assert_close(got, want, msg="step must return what LBFGS's own step returns")
    assert len(evaluations) > 2, "LBFGS was not allowed to evaluate the closure several times"
    assert_params_close(model, oracle, cell, "two LBFGS steps")
    lbfgs_context = make_context(accumulate_grad_batches=2)
    lbfgs_model = lbfgs_context.prepare_module(make_model())
    lbfgs = torch.optim.LBFGS(lbfgs_model.parameters())
    with pytest.raises(ValueError, match=r"(?i)accumulat"):
        lbfgs_context.wrap(lbfgs).step(closure)


@pytest.mark.requirement("BWD-001")
@pytest.mark.cells(precisions=NOT_LOSS_SCALED)
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
