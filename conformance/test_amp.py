"""Checks of the mixed and low precisions: loss scaling, skipped steps, unscaling, clipping, bf16."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import pytest
import torch

from lightning_optimizer.conformance.harness import (
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
    run_steps,
)
from lightning_optimizer.conformance.oracles import WindowOracle, expected_outcomes, oracle_copy
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, SKIP = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE


class _Halves(torch.nn.Module):
    """Two independent halves, one optimizer each."""

    def __init__(self) -> None:
        super().__init__()
        self.a = make_model(seed=21)
        self.b = make_model(seed=22)


LR = 10.0
"""Large enough that a twice-too-large or badly scaled gradient moves the parameters far beyond the tolerance."""


def _halves(make_context: MakeContext, cell: Cell, **kwargs: Any) -> tuple[TrainingContext, _Halves, Any, Any]:
    context = make_context(**kwargs)
    model = context.prepare_module(_Halves())
    assert isinstance(model, _Halves)
    opt_a = context.wrap(torch.optim.SGD(model.a.parameters(), lr=LR, momentum=0.9))
    opt_b = context.wrap(torch.optim.SGD(model.b.parameters(), lr=LR, momentum=0.9))
    return context, model, opt_a, opt_b


LOSS_FACTOR = 1e-3
"""Keeps scaled fp16 gradients finite at GradScaler's initial scale, so that only injected overflows skip."""
CLIPPED_LOSS_FACTOR = 1.0
"""Gradients of order one, which the clipping checks' thresholds (0.05, 0.02) really clip. Under 16-mixed the
first step may overflow at the initial scale; the oracle's plain GradScaler skips it too."""


def _loss(
    context: TrainingContext,
    model: torch.nn.Module,
    batch: Any,
    cell: Cell,
    blow_up: bool = False,
    factor: float = LOSS_FACTOR,
) -> torch.Tensor:
    with context.autocast():
        loss = mse(model, batch, cell_device(cell), cell_dtype(cell)) * factor
    return loss * float("inf") if blow_up else loss


def _closure(wrapper: Any, loss: Callable[[], torch.Tensor]) -> Callable[[], None]:
    def closure() -> None:
        wrapper.backward(loss())

    return closure


def _oracle_loss(
    model: torch.nn.Module, batch: Any, cell: Cell, blow_up: bool = False, factor: float = LOSS_FACTOR
) -> torch.Tensor:
    with oracle_autocast(cell):
        loss = mse(model, batch, cell_device(cell), cell_dtype(cell)) * factor
    return loss * float("inf") if blow_up else loss


@pytest.mark.requirement("AMP-001")
@pytest.mark.cells(precisions=("16-mixed",))
def test_16_mixed_autocasts_and_scales_the_loss(make_context: MakeContext, cell: Cell) -> None:
    """16-mixed runs the forward pass in float16 and backpropagates a loss scaled by a power of two."""
    context = make_context()
    base = make_model()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    x, y = (t.to(cell_device(cell)) for t in make_batches(1)[0])
    with context.autocast():
        out = model(x)
    assert out.dtype == torch.float16, f"16-mixed computed the forward pass in {out.dtype}, not float16"
    wrapper.backward(torch.nn.functional.mse_loss(out.float(), y) * 1e-3)
    with oracle_autocast(cell):
        want = torch.nn.functional.mse_loss(oracle(x).float(), y) * 1e-3
    want.backward()
    got_w, want_w = next(model.parameters()).grad, next(oracle.parameters()).grad
    assert got_w is not None and want_w is not None
    ratio = (got_w.double().norm() / want_w.double().norm()).item()
    exponent = round(torch.log2(torch.tensor(ratio)).item())
    assert exponent >= 1 and abs(ratio / 2**exponent - 1) < 1e-2, (
        f"the gradient after wrapper.backward is {ratio:.4g} x the true one: not a loss scaled by a power of two"
    )


@pytest.mark.requirement("AMP-003", "AMP-004", "STEP-004")
@pytest.mark.cells(precisions=("16-mixed",))
def test_overflow_in_one_optimizer_skips_only_that_one(make_context: MakeContext, cell: Cell) -> None:
    """Batch 0: A's gradients are infinite, B's finite. A skips, B steps with its true gradient; then both step.

    Both backward passes run before either step, so a scale that backed off after A's skip (an update per
    optimizer instead of per iteration) would unscale B's gradient with half its scale: twice the gradient.
    The oracle is PyTorch's documented rule: one scaler, ``unscale_`` and ``step`` per optimizer, one
    ``update`` per iteration after both.
    """
    context, model, opt_a, opt_b = _halves(make_context, cell)
    oracle = oracle_copy(_Halves(), cell)
    assert isinstance(oracle, _Halves)
    oracle_a = torch.optim.SGD(oracle.a.parameters(), lr=LR, momentum=0.9)
    oracle_b = torch.optim.SGD(oracle.b.parameters(), lr=LR, momentum=0.9)
    scaler = oracle_scaler(cell)
    assert scaler is not None
    a_before = [p.detach().clone() for p in model.a.parameters()]
    batches = make_batches(3)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        blow_up = batch_idx == 0
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            opt_a.backward(_loss(context, model.a, batch, cell, blow_up))
            opt_b.backward(_loss(context, model.b, batch, cell))
            opt_a.step(make_optimizer_step=True)
            outcome_a = opt_a.last_outcome
            opt_b.step(make_optimizer_step=True)
            outcomes.append((outcome_a, opt_b.last_outcome))
        if blow_up:
            assert all(torch.equal(p.detach(), q) for p, q in zip(model.a.parameters(), a_before, strict=True)), (
                "a step skipped for infinite gradients changed A's parameters"
            )
            assert len(opt_a.optimizer.state) == 0 or all(
                not any(v.isnan().any() for v in s.values() if isinstance(v, torch.Tensor))
                for s in opt_a.optimizer.state.values()
            ), "a skipped step wrote non-finite values into A's optimizer state"
        scaler.scale(_oracle_loss(oracle.a, batch, cell, blow_up)).backward()
        scaler.scale(_oracle_loss(oracle.b, batch, cell)).backward()
        for optimizer in (oracle_a, oracle_b):
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
            optimizer.zero_grad(set_to_none=True)
        scaler.update()
        oracle_step_done(cell)
    assert outcomes[0] == (SKIP, S), f"batch 0 outcomes (A, B): {outcomes[0]}, expected A skipped and B stepped"
    assert all(pair == (S, S) for pair in outcomes[1:]), f"outcomes after the overflow: {outcomes[1:]}"
    assert_params_close(model, oracle, cell, "two optimizers, one overflowing in the first batch")


@pytest.mark.requirement("AMP-006", "AMP-003")
@pytest.mark.cells(precisions=("16-mixed",))
def test_open_window_survives_a_scale_change(make_context: MakeContext, cell: Cell) -> None:
    """A accumulates over batches 0 and 1 while B overflows in batch 0 (the scale backs off in between).

    A's real step must still apply the true mean of its two micro-batch gradients, worked out here with no
    loss scaling at all.
    """
    context, model, opt_a, opt_b = _halves(make_context, cell)
    oracle = oracle_copy(_Halves(), cell)
    assert isinstance(oracle, _Halves)
    oracle_a = torch.optim.SGD(oracle.a.parameters(), lr=LR, momentum=0.9)
    batches = make_batches(2)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx):
            loss_a = partial(_loss, context, model.a, batch, cell)
            opt_a.step(_closure(opt_a, loss_a), make_optimizer_step=batch_idx == 1)
            if batch_idx == 0:
                loss_b = partial(_loss, context, model.b, batch, cell, True)
                opt_b.step(_closure(opt_b, loss_b), make_optimizer_step=True)
                assert opt_b.last_outcome is SKIP, f"B's infinite gradients did not skip its step: {opt_b.last_outcome}"
    assert opt_a.last_outcome is S, f"A's window did not step: {opt_a.last_outcome}"
    for batch in batches:
        _oracle_loss(oracle.a, batch, cell).backward()
    for param in oracle.a.parameters():
        assert param.grad is not None
        param.grad /= 2
    oracle_a.step()
    assert_params_close(model.a, oracle.a, cell, "A's window across B's overflow")


@pytest.mark.requirement("AMP-002", "ACC-001")
@pytest.mark.cells(precisions=("16-mixed",))
def test_accumulation_over_four_micro_batches(make_context: MakeContext, cell: Cell) -> None:
    """Windows of four fp16 micro-batches equal the oracle that divides, then unscales once."""
    context = make_context(accumulate_grad_batches=4)
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    oracle = WindowOracle(oracle_model, torch.optim.SGD(oracle_model.parameters(), lr=0.1, momentum=0.9), cell)
    batches = make_batches(12)
    outcomes = run_steps(context, model, wrapper, batches, cell)
    oracle.train_windows(batches, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    assert outcomes == expected_outcomes([A, A, A, S] * 3, oracle.stepped), f"outcomes were {outcomes}"
    assert_params_close(model, oracle_model, cell, "three windows of four fp16 micro-batches")


def _clipping_oracle(cell: Cell, batches: list[Any], clip: Callable[[list[torch.Tensor]], object]) -> torch.nn.Module:
    """One SGD step per batch: (scaled) backward, unscale, ``clip``, step, update."""
    oracle = oracle_copy(make_model(), cell)
    optimizer = torch.optim.SGD(oracle.parameters(), lr=0.5)
    scaler = oracle_scaler(cell)
    for batch in batches:
        loss = _oracle_loss(oracle, batch, cell, factor=CLIPPED_LOSS_FACTOR)
        (loss if scaler is None else scaler.scale(loss)).backward()
        if scaler is not None:
            scaler.unscale_(optimizer)
        clip(list(oracle.parameters()))
        if scaler is None:
            optimizer.step()
        else:
            scaler.step(optimizer)
            scaler.update()
        optimizer.zero_grad(set_to_none=True)
        oracle_step_done(cell)
    return oracle


@pytest.mark.requirement("CLIP-002", "AMP-002")
def test_manual_clip_after_unscale_gradients(make_context: MakeContext, cell: Cell) -> None:
    """``unscale_gradients()``, a hand-written clip, then ``step()``: unscaled once, clipped once."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.5))
    batches = make_batches(3)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx):
            wrapper.backward(_loss(context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            wrapper.unscale_gradients()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            wrapper.step(make_optimizer_step=True)
    oracle = _clipping_oracle(cell, batches, lambda params: torch.nn.utils.clip_grad_norm_(params, 0.05))
    assert_params_close(model, oracle, cell, "unscale_gradients(), clip_grad_norm_(0.05), step()")
    wrapper.backward(_loss(context, model, batches[0], cell))
    wrapper.unscale_gradients()
    with pytest.raises(RuntimeError, match="unscale_gradients"):
        wrapper.step(make_optimizer_step=False)
    prepared = [param.grad.detach().clone() for param in model.parameters() if param.grad is not None]
    with pytest.raises(RuntimeError, match="unscale_gradients"):
        wrapper.zero_grad()
    kept = [param.grad for param in model.parameters() if param.grad is not None]
    assert len(kept) == len(prepared) and all(torch.equal(a, b) for a, b in zip(kept, prepared, strict=True)), (
        "zero_grad() after unscale_gradients() changed the prepared gradients"
    )
    wrapper.step(make_optimizer_step=True)

    def unscaling_closure() -> None:
        wrapper.backward(_loss(context, model, batches[1], cell))
        wrapper.unscale_gradients()

    with pytest.raises(RuntimeError, match="unscale_gradients"):
        wrapper.step(unscaling_closure, make_optimizer_step=False)
    assert all(param.grad is None for param in model.parameters()), (
        "unscale_gradients() in the closure of a step that does not close the window: the window must stay empty"
    )


@pytest.mark.requirement("CLIP-001")
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_configured_clipping(make_context: MakeContext, cell: Cell, algorithm: str) -> None:
    """``gradient_clip_val`` clips the unscaled gradients right before each real step."""
    context = make_context(gradient_clip_val=0.02, gradient_clip_algorithm=algorithm)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.5))
    batches = make_batches(3)
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx):
            loss = partial(_loss, context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            wrapper.step(_closure(wrapper, loss))

    def clip(params: list[torch.Tensor]) -> None:
        if algorithm == "norm":
            torch.nn.utils.clip_grad_norm_(params, 0.02)
        else:
            torch.nn.utils.clip_grad_value_(params, 0.02)

    assert_params_close(model, _clipping_oracle(cell, batches, clip), cell, f"clipping by {algorithm} at 0.02")


@pytest.mark.requirement("AMP-005")
@pytest.mark.features("closure_evaluating_optimizers")
@pytest.mark.cells(precisions=("16-mixed",))
def test_lbfgs_is_refused_under_16_mixed(make_context: MakeContext, cell: Cell) -> None:
    """16-mixed with LBFGS raises ``TypeError`` before the closure runs."""
    context = make_context()
    model = context.prepare_module(make_model())
    calls: list[int] = []

    def closure() -> torch.Tensor:
        calls.append(1)
        return torch.zeros(())

    with pytest.raises(TypeError, match="LBFGS"):
        context.wrap(torch.optim.LBFGS(model.parameters())).step(closure)
    assert calls == [], "the closure ran before 16-mixed with LBFGS was refused"


@pytest.mark.requirement("SCHED-002", "AMP-004")
@pytest.mark.features("lr_schedulers")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("built_on", ["wrapper", "inner"])
def test_skipped_step_does_not_make_a_scheduler_warn(make_context: MakeContext, cell: Cell, built_on: str) -> None:
    """A skipped first step, then ``scheduler.step()``: no warning, parameters and state untouched."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(target, step_size=1, gamma=0.5)
        with context.batch(0):
            wrapper.step(lambda: wrapper.backward(_loss(context, model, make_batches(1)[0], cell, True)))
        scheduler.step()
    assert wrapper.last_outcome is SKIP, f"infinite gradients gave {wrapper.last_outcome}"
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before, strict=True))
    assert len(wrapper.optimizer.state) == 0, "a skipped step created optimizer state (Adam's step count)"


@pytest.mark.requirement("PREC-003")
@pytest.mark.cells(precisions=("bf16-mixed",))
def test_bf16_mixed_is_autocast_only(make_context: MakeContext, cell: Cell) -> None:
    """bf16-mixed: float32 parameters, bfloat16 forward, the true (unscaled) gradient, never a skip."""
    context = make_context()
    base = make_model()
    oracle = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    assert {p.dtype for p in model.parameters()} == {torch.float32}, "bf16-mixed must keep float32 parameters"
    batch = make_batches(1)[0]
    x = batch[0].to(cell_device(cell))
    with context.autocast():
        out = model(x)
    assert out.dtype == torch.bfloat16, f"bf16-mixed computed the forward pass in {out.dtype}"
    wrapper.backward(_loss(context, model, batch, cell))
    _oracle_loss(oracle, batch, cell).backward()
    for got, want in zip(model.parameters(), oracle.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad, want.grad, msg="bf16-mixed scaled or changed the gradient")
    wrapper.zero_grad()
    wrapper.step(lambda: wrapper.backward(_loss(context, model, batch, cell, True)), make_optimizer_step=True)
    assert wrapper.last_outcome is S, f"bf16-mixed has no scaler and never skips; got {wrapper.last_outcome}"


@pytest.mark.requirement("PREC-002")
@pytest.mark.cells(precisions=("bf16-true",))
def test_bf16_true_keeps_model_and_state_in_bf16(make_context: MakeContext, cell: Cell) -> None:
    """bf16-true: bfloat16 parameters, forward pass and Adam state."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}, "bf16-true must hold bfloat16 parameters"
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    dtypes = {v.dtype for s in wrapper.optimizer.state.values() for k, v in s.items() if k != "step"}
    assert dtypes == {torch.bfloat16}, f"bf16-true optimizer state is in {sorted(map(str, dtypes))}"
