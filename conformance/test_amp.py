"""Checks of the mixed and low precisions: loss scaling, skipped steps, unscaling, clipping, bf16."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any, cast

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_grads_close, assert_same_grads, cloned, grads
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    REORDERED_TOLERANCES,
    Halves,
    assert_params_close,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
    refuses,
    run_steps,
    scaler_settings,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import (
    WindowOracle,
    expected_outcomes,
    oracle_copy,
)
from lightning_optimizer.conformance.outcomes import not_applicable
from lightning_optimizer.conformance.plain_loop import (
    ClipFunction,
    PlainWindows,
    clipper,
    oracle_loss,
    params_of,
    plain_scaler,
    real_step,
    scaled_backward,
    train_windows,
    update_scaler,
    window_mean,
)
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
A, S, SKIP = StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE


LR = 10.0
"""Large enough that a twice-too-large or badly scaled gradient moves the parameters far beyond the tolerance."""


def _halves(make_context: MakeContext, cell: Cell, **kwargs: Any) -> tuple[TrainingContext, Halves, Any, Any]:
    context = make_context(**kwargs)
    model = context.prepare_module(Halves(21, 22))
    assert isinstance(model, Halves)
    opt_a = context.wrap(torch.optim.SGD(model.a.parameters(), lr=LR, momentum=0.9))
    opt_b = context.wrap(torch.optim.SGD(model.b.parameters(), lr=LR, momentum=0.9))
    return context, model, opt_a, opt_b


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


def _closure(
    wrapper: Any, loss: Callable[[], torch.Tensor], seen: list[torch.Tensor] | None = None
) -> Callable[[], None]:
    """A closure that passes ``loss()`` to the wrapper's backward; ``seen`` records its factor (:func:`_hooked`)."""

    def closure() -> None:
        wrapper.backward(loss() if seen is None else _hooked(loss(), seen))

    return closure


@pytest.mark.requirement("AMP-001")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.varies(loss_scale=("initial",), call_form=("backward, then step()",))
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
@pytest.mark.varies(
    wrappers=("2",),
    loss_scale=("backed off",),
    call_form=("backward, then step()",),
    make_optimizer_step=("True",),
    outcome_read=("after its own call",),
)
def test_overflow_in_one_optimizer_skips_only_that_one(make_context: MakeContext, cell: Cell) -> None:
    """Batch 0: A's gradients are infinite, B's finite. A skips, B steps with its true gradient; then both step.

    Both backward passes run before either step, so a scale that backed off after A's skip (an update per
    optimizer instead of per iteration) would unscale B's gradient with half its scale: twice the gradient.
    The oracle is PyTorch's documented rule: one scaler, ``unscale_`` and ``step`` per optimizer, one
    ``update`` per iteration after both.
    """
    context, model, opt_a, opt_b = _halves(make_context, cell)
    oracle = oracle_copy(Halves(21, 22), cell)
    assert isinstance(oracle, Halves)
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
        scaled_backward(oracle_loss(oracle.a, batch, cell, blow_up), scaler)
        scaled_backward(oracle_loss(oracle.b, batch, cell), scaler)
        for optimizer in (oracle_a, oracle_b):
            real_step(optimizer, 1, scaler)
        update_scaler(scaler)
        oracle_step_done(cell)
    assert outcomes[0] == (SKIP, S), f"batch 0 outcomes (A, B): {outcomes[0]}, expected A skipped and B stepped"
    assert all(pair == (S, S) for pair in outcomes[1:]), f"outcomes after the overflow: {outcomes[1:]}"
    assert_params_close(model, oracle, cell, "two optimizers, one overflowing in the first batch")


@pytest.mark.requirement("AMP-006", "AMP-003")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "open while another optimizer steps", "open across a scale change"),
    wrappers=("2",),
    loss_scale=("backed off",),
)
def test_open_window_survives_a_scale_change(make_context: MakeContext, cell: Cell) -> None:
    """A accumulates over batches 0 and 1 while B overflows in batch 0 (the scale backs off in between).

    A's real step must still apply the true mean of its two micro-batch gradients, worked out here with no
    loss scaling at all.
    """
    context, model, opt_a, opt_b = _halves(make_context, cell)
    oracle = oracle_copy(Halves(21, 22), cell)
    assert isinstance(oracle, Halves)
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
        oracle_loss(oracle.a, batch, cell).backward()
    for param in oracle.a.parameters():
        assert param.grad is not None
        param.grad /= 2
    oracle_a.step()
    assert_params_close(model.a, oracle.a, cell, "A's window across B's overflow")


@pytest.mark.requirement("AMP-002", "ACC-001")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.varies(window=("k >= 2 micro-steps",), make_optimizer_step=("None",), loss_scale=("initial",))
def test_accumulation_over_four_micro_batches(make_context: MakeContext, cell: Cell) -> None:
    """Windows of four fp16 micro-batches equal the oracle that divides, then unscales once."""
    context = make_context(accumulate_grad_batches=4)
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    oracle = WindowOracle(oracle_model, torch.optim.SGD(oracle_model.parameters(), lr=0.1, momentum=0.9), cell, 4)
    batches = make_batches(12)
    outcomes = run_steps(context, model, wrapper, batches, cell)
    oracle.train_windows(batches, [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]])
    assert outcomes == expected_outcomes([A, A, A, S] * 3, oracle.stepped), f"outcomes were {outcomes}"
    assert_params_close(model, oracle_model, cell, "three windows of four fp16 micro-batches")


def _clipping_oracle(cell: Cell, batches: list[Any], clip: ClipFunction) -> torch.nn.Module:
    """One SGD step per batch of the plain loop: (scaled) backward, unscale, ``clip``, step, update."""
    oracle = oracle_copy(make_model(), cell)
    optimizer = torch.optim.SGD(oracle.parameters(), lr=0.5)
    windows = [[batch_idx] for batch_idx in range(len(batches))]
    train_windows(cell, oracle, optimizer, batches, windows, oracle_scaler(cell), factor=CLIPPED_LOSS_FACTOR, clip=clip)
    return oracle


@pytest.mark.requirement("CLIP-002", "AMP-002")
@pytest.mark.varies(
    clipping=("unscale_gradients() by hand",),
    window=("1 micro-step",),
    call_form=("backward, then step()", "closure, wrapper.backward"),
    make_optimizer_step=("True", "False"),
)
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
    with refuses(
        RuntimeError,
        "wrapper.step(make_optimizer_step=False) after unscale_gradients()",
        "CLIP-002: a step() that would not close the window unscale_gradients() prepared is refused",
    ):
        wrapper.step(make_optimizer_step=False)
    prepared = [param.grad.detach().clone() for param in model.parameters() if param.grad is not None]
    with refuses(
        RuntimeError,
        "wrapper.zero_grad() after unscale_gradients(), before the closing step()",
        "CLIP-002: a zero_grad() would discard the prepared gradients, so it is refused until the closing step()",
    ):
        wrapper.zero_grad()
    kept = [param.grad for param in model.parameters() if param.grad is not None]
    assert len(kept) == len(prepared) and all(torch.equal(a, b) for a, b in zip(kept, prepared, strict=True)), (
        "zero_grad() after unscale_gradients() changed the prepared gradients"
    )
    wrapper.step(make_optimizer_step=True)

    def unscaling_closure() -> None:
        wrapper.backward(_loss(context, model, batches[1], cell))
        wrapper.unscale_gradients()

    with refuses(
        RuntimeError,
        "wrapper.step(closure, make_optimizer_step=False) whose closure calls unscale_gradients()",
        "CLIP-002: unscale_gradients() inside the closure of a step() that does not close the window is refused",
    ):
        wrapper.step(unscaling_closure, make_optimizer_step=False)
    assert all(param.grad is None for param in model.parameters()), (
        "unscale_gradients() in the closure of a step that does not close the window: the window must stay empty"
    )


@pytest.mark.requirement("CLIP-001")
@pytest.mark.parametrize("algorithm", ["norm", "value"])
@pytest.mark.varies(clipping=("norm", "value"), window=("1 micro-step",), loss_scale=("initial",))
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
    oracle = _clipping_oracle(cell, batches, clipper(algorithm, 0.02))
    assert_params_close(model, oracle, cell, f"clipping by {algorithm} at 0.02")


@pytest.mark.requirement("AMP-005")
@pytest.mark.features("closure_evaluating_optimizers")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.varies(optimizer=("LBFGS",), faults=("invalid argument",))
def test_lbfgs_is_refused_under_16_mixed(make_context: MakeContext, cell: Cell) -> None:
    """16-mixed: ``wrap`` of LBFGS raises ``TypeError``, so no closure can run and no wrapper exists."""
    context = make_context()
    model = context.prepare_module(make_model())
    calls: list[int] = []

    def closure() -> torch.Tensor:
        calls.append(1)
        return torch.zeros(())

    inner = torch.optim.LBFGS(model.parameters())
    try:
        wrapper = context.wrap(inner)
    except TypeError:
        return
    try:
        wrapper.step(closure)
    except TypeError:
        pytest.fail(f"LBFGS under 16-mixed was refused by step() (after {len(calls)} closure runs), not by wrap()")
    pytest.fail("LBFGS under 16-mixed was accepted")


@pytest.mark.requirement("SCHED-002", "AMP-004")
@pytest.mark.features("lr_schedulers")
@pytest.mark.cells(precisions=("16-mixed",))
@pytest.mark.parametrize("built_on", ["wrapper", "inner"])
@pytest.mark.varies(optimizer=("Adam",), window=("1 micro-step",), loss_scale=("initial",))
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
@pytest.mark.varies(
    window=("1 micro-step",),
    make_optimizer_step=("True",),
    call_form=("backward, then step()", "closure, wrapper.backward"),
)
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
    oracle_loss(oracle, batch, cell).backward()
    for got, want in zip(model.parameters(), oracle.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad, want.grad, msg="bf16-mixed scaled or changed the gradient")
    wrapper.zero_grad()
    wrapper.step(lambda: wrapper.backward(_loss(context, model, batch, cell, True)), make_optimizer_step=True)
    assert wrapper.last_outcome is S, f"bf16-mixed has no scaler and never skips; got {wrapper.last_outcome}"


@pytest.mark.requirement("PREC-002")
@pytest.mark.cells(precisions=("bf16-true",))
@pytest.mark.varies(optimizer=("Adam",), window=("1 micro-step",))
def test_bf16_true_keeps_model_and_state_in_bf16(make_context: MakeContext, cell: Cell) -> None:
    """bf16-true: bfloat16 parameters, forward pass and Adam state."""
    context = make_context()
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.1))
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}, "bf16-true must hold bfloat16 parameters"
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: True)
    dtypes = {v.dtype for s in wrapper.optimizer.state.values() for k, v in s.items() if k != "step"}
    assert dtypes == {torch.bfloat16}, f"bf16-true optimizer state is in {sorted(map(str, dtypes))}"


# -- clipping, unscaling and loss scaling along windows, groups, wrappers, scale changes and optimizer kinds --------

CLIP_LR = 5.0
"""A clipped step moves the parameters by up to ``CLIP_LR * CLIP_VALUE``: a wrong clip shows in every cell."""
CLIP_VALUE = 0.02
HAND_CLIP = 0.05
SMALL_SCALE = GradScalerSettings(init_scale=2.0**4)
"""The clipping checks' loss scaler: the gradients of ``CLIPPED_LOSS_FACTOR`` losses stay finite in fp16 from the
first step, so that every window really is clipped (none is skipped for an overflow)."""
GROWING = GradScalerSettings(init_scale=2.0**10, growth_interval=1)
"""A loss scale that doubles after every iteration in which an optimizer stepped without an overflow."""
GROWTH_LOSS_FACTOR = 0.1
"""At the ``GROWING`` scales fp16 gradients of these losses stay finite, and a window's mean is large enough that a
micro-step counted at the wrong scale moves the parameters far beyond XLA's tolerance, and rounding does not."""
GROWTH_LR = 0.5

EAGER_DEVICES = ("cpu", "cuda")
"""Where the checks run whose rules take no XLA-specific path (one XLA device reduces nothing across replicas): XLA
compiles a graph for each new sequence of operations, and the clipping and unscaling checks over windows on XLA
are ``test_configured_clipping_over_windows`` and the ones of one window."""


def _thirds() -> torch.nn.ModuleList:
    """Three independent parts, one optimizer each."""
    return torch.nn.ModuleList(make_model(seed=seed) for seed in (21, 22, 23))


CLIP_SCHEDULE: tuple[bool | None, ...] = (None, True, None, None, None)
"""``make_optimizer_step`` per batch with ``accumulate_grad_batches=3``; the windows are ``CLIP_WINDOWS``."""
CLIP_WINDOWS = [[0, 1], [2], [3, 4]]
"""Worked out by hand: cut short by True at batch 1, closed by the schedule at 2, flushed by the last batch 4."""


@pytest.mark.requirement("CLIP-001", "ACC-001", "AMP-002")
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "None"),
    clipping=("norm", "value"),
    loss_scale=("initial", "settings given to the factory"),
    call_form=("closure, wrapper.backward",),
    optimizer=("SGD",),
)
@pytest.mark.parametrize("algorithm", ["norm", "value"])
def test_configured_clipping_over_windows(make_context: MakeContext, cell: Cell, algorithm: str) -> None:
    """Windows of 2, 1 and 2 (cut short, scheduled, flushed): each window's mean is unscaled, clipped, applied."""
    context = make_context(
        accumulate_grad_batches=3,
        gradient_clip_val=CLIP_VALUE,
        gradient_clip_algorithm=algorithm,
        **scaler_settings(cell, SMALL_SCALE),
    )
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=CLIP_LR))
    batches = make_batches(len(CLIP_SCHEDULE))
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            loss = partial(_loss, context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            wrapper.step(_closure(wrapper, loss), make_optimizer_step=CLIP_SCHEDULE[batch_idx])
            outcomes.append(wrapper.last_outcome)
    oracle_optimizer = torch.optim.SGD(oracle_model.parameters(), lr=CLIP_LR)
    stepped = train_windows(
        cell,
        oracle_model,
        oracle_optimizer,
        batches,
        CLIP_WINDOWS,
        plain_scaler(cell, SMALL_SCALE),
        accumulate=3,
        factor=CLIPPED_LOSS_FACTOR,
        clip=clipper(algorithm, CLIP_VALUE),
    )
    assert outcomes == expected_outcomes([A, S, S, A, S], stepped), (
        f"outcomes were {outcomes} for windows {CLIP_WINDOWS} (accumulate_grad_batches=3)"
    )
    assert_params_close(
        model,
        oracle_model,
        cell,
        f"clipping by {algorithm} at {CLIP_VALUE} of the windows {CLIP_WINDOWS} (mean, unscale, clip, step)",
    )


def _grouped_sgd(part: torch.nn.Module, wrap: Callable[[torch.optim.SGD], Any]) -> Any:
    """SGD over a two-layer part in three groups with other learning rates and momenta, the third added after wrap.

    Groups: the first layer; the second layer's weight; its bias, added (to the wrapper) after ``wrap``.
    """
    first, second = (layer for layer in part.children() if isinstance(layer, torch.nn.Linear))
    groups: list[dict[str, Any]] = [
        {"params": list(first.parameters())},
        {"params": [second.weight], "lr": 2.0, "momentum": 0.9},
    ]
    optimizer = wrap(torch.optim.SGD(groups, lr=CLIP_LR))
    optimizer.add_param_group({"params": [second.bias], "lr": 1.0, "momentum": 0.5})
    return optimizer


@pytest.mark.requirement("CLIP-001", "ACC-001", "STEP-004")
@pytest.mark.cells(devices=EAGER_DEVICES)
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    make_optimizer_step=("True", "False", "None"),
    wrappers=("2",),
    param_groups=("2 with other hyper-parameters", "added after wrap"),
    clipping=("norm",),
    loss_scale=("settings given to the factory",),
    call_form=("closure, wrapper.backward",),
    optimizer=("SGD", "SGD momentum"),
    outcome_read=("after every call of every wrapper",),
)
def test_configured_clipping_spans_groups_and_spares_other_windows(make_context: MakeContext, cell: Cell) -> None:
    """A's clip takes the total norm over all its groups (one added after wrap); B's open window is not touched."""
    context = make_context(gradient_clip_val=CLIP_VALUE, **scaler_settings(cell, SMALL_SCALE))
    model = context.prepare_module(Halves(21, 22))
    assert isinstance(model, Halves)
    opt_a = _grouped_sgd(model.a, context.wrap)
    opt_b = context.wrap(torch.optim.SGD(model.b.parameters(), lr=CLIP_LR))
    oracle = oracle_copy(Halves(21, 22), cell)
    assert isinstance(oracle, Halves)
    oracle_a = _grouped_sgd(oracle.a, lambda optimizer: optimizer)
    oracle_b = torch.optim.SGD(oracle.b.parameters(), lr=CLIP_LR)
    scaler = plain_scaler(cell, SMALL_SCALE)
    clip = clipper("norm", CLIP_VALUE)
    batches = make_batches(3)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        b_closes = batch_idx == len(batches) - 1
        with context.batch(batch_idx, is_last=b_closes):
            loss_b = partial(_loss, context, model.b, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            opt_b.step(_closure(opt_b, loss_b), make_optimizer_step=b_closes)
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            b_before = None if b_closes else grads(model.b.parameters())
            loss_a = partial(_loss, context, model.a, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            opt_a.step(_closure(opt_a, loss_a))
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            if b_before is not None:
                assert_same_grads(
                    grads(model.b.parameters()), b_before, f"batch {batch_idx}: B's open window across A's clipped step"
                )
        scaled_backward(oracle_loss(oracle.b, batch, cell, factor=CLIPPED_LOSS_FACTOR), scaler, 1)
        if b_closes:
            real_step(oracle_b, len(batches), scaler, 1, clip=clip)
        scaled_backward(oracle_loss(oracle.a, batch, cell, factor=CLIPPED_LOSS_FACTOR), scaler, 1)
        real_step(oracle_a, 1, scaler, 1, clip=clip)
        update_scaler(scaler, () if b_closes else oracle.b.parameters())
        oracle_step_done(cell)
    want = [(None, A), (S, A), (S, A), (S, A), (S, S), (S, S)]
    assert outcomes == want, f"(A, B) outcomes after each call were {outcomes}, expected {want}"
    assert_params_close(model.a, oracle.a, cell, "A: three groups (one added after wrap) clipped by their total norm")
    assert_params_close(model.b, oracle.b, cell, "B: a window of three, clipped on its own real step")


UNSCALE_SCHEDULE: tuple[bool | None, ...] = (None, None, True, None, True, False, None)
"""``make_optimizer_step`` per batch of the ``unscale_gradients()`` check, with ``accumulate_grad_batches=3``."""
UNSCALE_CLOSING = (2, 4, 6)
UNSCALE_WINDOWS = [[0, 1, 2], [3, 4], [5, 6]]
"""Worked out by hand: full (closed by True), cut short by True, kept open by False and flushed by the last batch."""


@pytest.mark.requirement("CLIP-002", "AMP-002", "ACC-001")
@pytest.mark.cells(devices=EAGER_DEVICES)
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
    clipping=("unscale_gradients() by hand",),
    call_form=("backward, then step()",),
    loss_scale=("settings given to the factory",),
)
def test_unscale_gradients_over_windows(make_context: MakeContext, cell: Cell) -> None:
    """Backward, then step: ``unscale_gradients()`` on a window's last micro-step gives its unscaled mean; a clip."""
    context = make_context(accumulate_grad_batches=3, **scaler_settings(cell, SMALL_SCALE))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=CLIP_LR))
    batches = make_batches(7)
    prepared: list[list[torch.Tensor | None]] = []
    hand_clip = clipper("norm", HAND_CLIP)

    def inspect_then_clip(params: list[torch.Tensor]) -> None:
        prepared.append(grads(params))
        hand_clip(params)

    stepped = train_windows(
        cell,
        oracle_model,
        torch.optim.SGD(oracle_model.parameters(), lr=CLIP_LR),
        batches,
        UNSCALE_WINDOWS,
        plain_scaler(cell, SMALL_SCALE),
        accumulate=3,
        factor=CLIPPED_LOSS_FACTOR,
        after_prepare=inspect_then_clip,
    )
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            wrapper.backward(_loss(context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            if batch_idx in UNSCALE_CLOSING:
                window = UNSCALE_WINDOWS[UNSCALE_CLOSING.index(batch_idx)]
                wrapper.unscale_gradients()
                assert_grads_close(
                    grads(model.parameters()),
                    prepared[UNSCALE_CLOSING.index(batch_idx)],
                    cell,
                    f"after unscale_gradients() on the last micro-step of the window {window} (its mean over "
                    f"{len(window)} micro-steps, unscaled)",
                )
                hand_clip(list(model.parameters()))
            wrapper.step(make_optimizer_step=UNSCALE_SCHEDULE[batch_idx])
            outcomes.append(wrapper.last_outcome)
    assert outcomes == expected_outcomes([A, A, S, A, S, A, S], stepped), (
        f"outcomes were {outcomes} for windows {UNSCALE_WINDOWS}"
    )
    assert_params_close(model, oracle_model, cell, f"unscale_gradients(), clip_grad_norm_, step() on {UNSCALE_WINDOWS}")


def _unscale_oracle(
    oracle: Halves, batches: list[Any], cell: Cell, a_closes: Sequence[bool], b_closes: Sequence[bool]
) -> list[tuple[int, list[torch.Tensor | None]]]:
    """The plain loop of A (SGD) and B (SGD momentum); for each of A's real steps, its window's length and gradients.

    Per batch B's micro-step, then A's; each window's mean unscaled and clipped to ``CLIP_VALUE`` by norm on its real
    step (A's gradients are returned as prepared so); one scaler, updated after each iteration in which one stepped.
    """
    a_optimizer = torch.optim.SGD(oracle.a.parameters(), lr=CLIP_LR)
    b_optimizer = torch.optim.SGD(oracle.b.parameters(), lr=CLIP_LR, momentum=0.9)
    loop = PlainWindows(cell, [a_optimizer, b_optimizer], plain_scaler(cell, SMALL_SCALE))
    closed: list[tuple[int, int]] = []
    prepared: list[list[torch.Tensor | None]] = []
    for batch_idx, batch in enumerate(batches):
        for index, part, closes in ((1, oracle.b, b_closes), (0, oracle.a, a_closes)):
            loop.backward(index, oracle_loss(part, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            if closes[batch_idx]:
                closed.append((index, loop.lengths[index]))
                loop.step(index, clipper("norm", CLIP_VALUE), lambda params: prepared.append(grads(params)))
        loop.update()
    return [(length, got) for (index, length), got in zip(closed, prepared, strict=True) if index == 0]


def _a_call(
    opt_a: Any,
    loss_a: Callable[[], torch.Tensor],
    a_params: list[torch.Tensor],
    batch_idx: int,
    closes: bool,
    b_open: Sequence[torch.Tensor],
) -> list[list[torch.Tensor | None]]:
    """A's call of the batch; its gradients after ``unscale_gradients()`` when it closes its window.

    Accumulating: backward, ``step(make_optimizer_step=False)``. Closing in batch 1: backward,
    ``unscale_gradients()``, step; otherwise all inside the closing step's closure. The gradients of B's open window
    (the parameters ``b_open``) are checked unchanged after A's ``unscale_gradients()`` or backward and after A's step.
    """
    prepared: list[list[torch.Tensor | None]] = []
    b_before = grads(b_open)

    def backward() -> None:
        opt_a.backward(loss_a())
        if closes:
            opt_a.unscale_gradients()
            prepared.append(grads(a_params))

    if closes and batch_idx != 1:
        opt_a.step(backward, make_optimizer_step=True)
    else:
        backward()
        after = "unscale_gradients()" if closes else "backward"
        assert_same_grads(grads(b_open), b_before, f"batch {batch_idx}: B's open window after A's {after}")
        opt_a.step(make_optimizer_step=closes)
    assert_same_grads(grads(b_open), b_before, f"batch {batch_idx}: B's open window after A's step")
    return prepared


@pytest.mark.requirement("CLIP-002", "CLIP-001", "AMP-002", "STEP-004")
@pytest.mark.cells(devices=EAGER_DEVICES)
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    make_optimizer_step=("True", "False"),
    wrappers=("2",),
    clipping=("norm", "unscale_gradients() by hand"),
    call_form=("backward, then step()", "closure, wrapper.backward"),
    loss_scale=("settings given to the factory",),
    optimizer=("SGD", "SGD momentum"),
    outcome_read=("after every call of every wrapper",),
)
def test_unscale_gradients_prepares_only_its_own_window(make_context: MakeContext, cell: Cell) -> None:
    """A's ``unscale_gradients()`` gives A's mean, unscaled and clipped as configured; B's open window is untouched.

    A: windows of two; batch 1 backward, ``unscale_gradients()``, step; batch 3 the same inside the closing step's
    closure. B (momentum): a window of three, open across A's batch 1, then one of one.
    """
    context = make_context(gradient_clip_val=CLIP_VALUE, **scaler_settings(cell, SMALL_SCALE))
    model = context.prepare_module(Halves(21, 22))
    assert isinstance(model, Halves)
    opt_a = context.wrap(torch.optim.SGD(model.a.parameters(), lr=CLIP_LR))
    opt_b = context.wrap(torch.optim.SGD(model.b.parameters(), lr=CLIP_LR, momentum=0.9))
    oracle = oracle_copy(Halves(21, 22), cell)
    assert isinstance(oracle, Halves)
    a_closes, b_closes = (False, True, False, True), (False, False, True, True)
    a_params: list[torch.Tensor] = list(model.a.parameters())
    batches = make_batches(4)
    want = _unscale_oracle(oracle, batches, cell, a_closes, b_closes)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == 3):
            opt_b.backward(_loss(context, model.b, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            opt_b.step(make_optimizer_step=b_closes[batch_idx])
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            b_open = [] if b_closes[batch_idx] else list(model.b.parameters())
            loss_a = partial(_loss, context, model.a, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            prepared = _a_call(opt_a, loss_a, a_params, batch_idx, a_closes[batch_idx], b_open)
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            if a_closes[batch_idx]:
                a_length, want_prepared = want.pop(0)
                form = "backward, then" if batch_idx == 1 else "in the closure of"
                assert_grads_close(
                    prepared[0],
                    want_prepared,
                    cell,
                    f"batch {batch_idx}: A's gradients after unscale_gradients() ({form} the closing step): the mean "
                    f"of {a_length} micro-steps, unscaled, clipped to norm {CLIP_VALUE} as configured",
                )
    want_outcomes = [(None, A), (A, A), (A, A), (S, A), (S, S), (A, S), (A, S), (S, S)]
    assert outcomes == want_outcomes, f"(A, B) outcomes after each call were {outcomes}, expected {want_outcomes}"
    assert_params_close(model.a, oracle.a, cell, "A: windows of two, unscale_gradients() then step()")
    assert_params_close(model.b, oracle.b, cell, "B: a window of three open across A's unscale_gradients(), then one")


def _hooked(loss: torch.Tensor, seen: list[torch.Tensor]) -> torch.Tensor:
    """``loss``, recording the gradient that reaches it in backward: the factor the loss was scaled by."""
    loss.register_hook(lambda grad: seen.append(grad.detach().float().reshape(())))
    return loss


def _scales(seen: list[torch.Tensor]) -> list[float]:
    return [float(value.item()) for value in seen]


def _run_thirds(
    context: TrainingContext,
    parts: Sequence[Any],
    opts: Sequence[Any],
    oracle: Sequence[Any],
    cell: Cell,
    a_plan: dict[int, bool | None],
    overflow: int,
    a_closes: int,
) -> tuple[list[tuple[StepOutcome | None, ...]], list[float], list[float]]:
    """The three wrappers' calls and the plain loop's: (A, B, C) outcomes after each call, each backward's factors.

    The plain loop is :class:`PlainWindows` with one ``GROWING`` scaler; the factors are the implementation's and its.

    Per batch: A in the closure form by ``a_plan`` (idle in the batches it leaves out); B's and C's backward, then
    B's and C's ``step(make_optimizer_step=True)``; B's loss is infinite in batch ``overflow``. The plain loop closes
    A's window in batch ``a_closes``.
    """
    optimizers = [torch.optim.SGD(part.parameters(), lr=GROWTH_LR, momentum=0.9) for part in oracle]
    loop = PlainWindows(cell, optimizers, plain_scaler(cell, GROWING), 3)
    seen: list[torch.Tensor] = []
    outcomes: list[tuple[StepOutcome | None, ...]] = []
    batches = make_batches(4)
    for batch_idx, batch in enumerate(batches):
        blow_up = [False, batch_idx == overflow, False]
        losses = [
            partial(_loss, context, part, batch, cell, blow_up[i], GROWTH_LOSS_FACTOR) for i, part in enumerate(parts)
        ]
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            if batch_idx in a_plan:
                opts[0].step(_closure(opts[0], losses[0], seen), make_optimizer_step=a_plan[batch_idx])
                outcomes.append(tuple(opt.last_outcome for opt in opts))
            for index in (1, 2):
                opts[index].backward(_hooked(losses[index](), seen))
            for index in (1, 2):
                opts[index].step(make_optimizer_step=True)
                outcomes.append(tuple(opt.last_outcome for opt in opts))
        for index, part in enumerate(oracle):
            if index or batch_idx in a_plan:
                loop.backward(index, oracle_loss(part, batch, cell, blow_up[index], GROWTH_LOSS_FACTOR))
        for index in (0, 1, 2) if batch_idx == a_closes else (1, 2):
            loop.step(index)
        loop.update()
    return outcomes, _scales(seen), loop.scales


@pytest.mark.requirement("AMP-006", "AMP-003", "AMP-004", "AMP-001", "STEP-004")
# torch_xla 2.9 compiles GradScaler's scale update once per process with the first scaler's growth_interval and
# growth_factor baked in: later scalers with other settings grow as the first one did. Growth is checked eagerly.
@pytest.mark.cells(devices=EAGER_DEVICES, precisions=("16-mixed",))
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps", "open across a scale change"),
    make_optimizer_step=("True", "None"),
    wrappers=("3",),
    loss_scale=("backed off", "grown", "settings given to the factory"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    optimizer=("SGD momentum",),
    outcome_read=("after every call of every wrapper",),
)
def test_open_window_across_scale_growth_and_back_off(make_context: MakeContext, cell: Cell) -> None:
    """Growth, B's overflow, growth: A's open window keeps its true mean, C its true gradient after B's overflow.

    A (closure form, accumulating by the schedule of three, closed by True in batch 3) is idle in batch 2: its window
    of three stays open across the growth after batch 0, the back-off after batch 1 and the growth after batch 2 (in
    which it took no micro-step). B and C backpropagate, then step, every batch; B's loss is infinite in batch 1.
    The factor of each backward (the gradient reaching the loss) is the oracle's: its scale, updated once per
    iteration after every optimizer that stepped and growing when none overflowed, over ``accumulate_grad_batches``.
    """
    context = make_context(accumulate_grad_batches=3, grad_scaler=GROWING)
    parts = list(context.prepare_module(_thirds()).children())
    opts = [context.wrap(torch.optim.SGD(p.parameters(), lr=GROWTH_LR, momentum=0.9)) for p in parts]
    oracle = list(oracle_copy(_thirds(), cell).children())
    a_plan: dict[int, bool | None] = {0: None, 1: None, 3: True}
    outcomes, scales, expected_scales = _run_thirds(context, parts, opts, oracle, cell, a_plan, overflow=1, a_closes=3)
    want_outcomes = [  # (A, B, C) after each call, worked by hand
        *((A, None, None), (A, S, None), (A, S, S)),  # batch 0
        *((A, S, S), (A, SKIP, S), (A, SKIP, S)),  # batch 1: B overflows
        *((A, S, S), (A, S, S)),  # batch 2: A idle
        *((S, S, S), (S, S, S), (S, S, S)),  # batch 3: A's window of three closes
    ]
    assert outcomes == want_outcomes, f"(A, B, C) outcomes after each call were {outcomes}, expected {want_outcomes}"
    assert scales == expected_scales, (
        f"the loss scales of the backward passes (A, B, C per batch; A idle in batch 2) were {scales}, expected "
        f"the plain GradScaler's {expected_scales} ({GROWING}: one update per iteration, growth after each "
        "without an overflow; each loss divided by accumulate_grad_batches=3 first, AMP-007)"
    )
    assert_params_close(parts[0], oracle[0], cell, "A: a window of three open across growth, back-off and growth")
    assert_params_close(parts[1], oracle[1], cell, "B: steps every batch, skipped in batch 1")
    assert_params_close(parts[2], oracle[2], cell, "C: steps every batch after B's overflow in the same iteration")


def _state_entries(optimizer: torch.optim.Optimizer) -> list[dict[str, Any]]:
    return [dict(optimizer.state[param]) if param in optimizer.state else {} for param in params_of(optimizer)]


def _assert_state_close(actual: list[dict[str, Any]], expected: list[dict[str, Any]], cell: Cell, what: str) -> None:
    tol = tolerance_for(cell)
    for i, (got, want) in enumerate(zip(actual, expected, strict=True)):
        assert sorted(got) == sorted(want), (
            f"{what}: parameter {i}'s optimizer state has {sorted(got)}, expected {sorted(want)}"
        )
        for key, value in want.items():
            mine = got[key]
            if key == "step":
                assert float(mine) == float(value), (
                    f"{what}: parameter {i}'s step count is {float(mine)}, expected {float(value)}"
                )
            elif isinstance(value, torch.Tensor):
                assert isinstance(mine, torch.Tensor), f"{what}: parameter {i}'s state {key!r} is not a tensor"
                if not torch.allclose(mine.cpu().double(), value.cpu().double(), rtol=tol.rtol, atol=tol.atol):
                    raise AssertionError(f"{what}: parameter {i}'s state {key!r} differs from the oracle's")


def _assert_skip_left_state(
    actual: list[dict[str, Any]], before: list[dict[str, Any]], oracle: list[dict[str, Any]], cell: Cell, what: str
) -> None:
    """After a skipped step, the state is as before it, or as the plain loop's.

    A fused optimizer's inner step runs and skips inside: it creates its state with step 0, which is no step either.
    """
    try:
        _assert_state_close(actual, before, cell, what)
    except AssertionError:
        _assert_state_close(actual, oracle, cell, f"{what} (neither as before the skip nor as the plain loop's)")


def _adam(kind: str, params: Iterable[torch.Tensor], cell: Cell) -> torch.optim.Adam:
    if kind == "fused" and cell.device not in ("cpu", "cuda"):
        not_applicable("torch's fused Adam runs on cpu and cuda only")
    return torch.optim.Adam(
        params, lr=0.05, fused=True if kind == "fused" else None, foreach=True if kind == "foreach" else None
    )


def _skip_oracle(
    cell: Cell, model: torch.nn.Module, optimizer: torch.optim.Adam, batches: list[Any], windows: list[list[int]]
) -> tuple[list[list[torch.Tensor | None]], list[list[dict[str, Any]]]]:
    """The plain loop over ``windows``, batch 0's loss infinite: each window's prepared gradients, Adam's state after.

    Torch's AMP recipe with a default plain ``GradScaler`` and ``accumulate_grad_batches`` the windows' length.
    """
    prepared: list[list[torch.Tensor | None]] = []
    states: list[list[dict[str, Any]]] = []  # as each window is prepared: after the windows before it

    def inspect(params: list[torch.Tensor]) -> None:
        prepared.append(grads(params))
        states.append(cast(list[dict[str, Any]], cloned(_state_entries(optimizer))))

    loop_args = (cell, model, optimizer, batches, windows, oracle_scaler(cell))
    train_windows(*loop_args, accumulate=len(windows[0]), after_prepare=inspect, blow_up=frozenset({0}))
    return prepared, [*states[1:], _state_entries(optimizer)]


@pytest.mark.requirement("AMP-004", "AMP-002", "CLIP-002", "STEP-004")
@pytest.mark.cells(devices=EAGER_DEVICES, precisions=("16-mixed",))
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps"),
    make_optimizer_step=("None",),
    optimizer=("Adam foreach", "Adam fused"),
    call_form=("backward, then step()",),
    clipping=("unscale_gradients() by hand",),
    loss_scale=("initial", "backed off"),
)
@pytest.mark.parametrize("window", [1, 3])
@pytest.mark.parametrize("kind", ["fused", "foreach"])
def test_skip_with_fused_and_foreach_adam(make_context: MakeContext, cell: Cell, kind: str, window: int) -> None:
    """An overflow in the window's first micro-step skips it (fused Adam skips inside its step); the next one steps.

    Backward, then step; ``unscale_gradients()`` on each window's last micro-step (the real window's gradients are
    the oracle's unscaled mean). The skipped window leaves parameters and Adam's state as a plain loop's, and does
    not count: after the next window, Adam's step count and moments are the plain fused or foreach Adam's.
    """
    context = make_context(accumulate_grad_batches=window)
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(_adam(kind, model.parameters(), cell))
    oracle_optimizer = _adam(kind, oracle_model.parameters(), cell)
    batches = make_batches(2 * window)
    windows = [list(range(window)), list(range(window, 2 * window))]
    prepared, states = _skip_oracle(cell, oracle_model, oracle_optimizer, batches, windows)
    params = list(model.parameters())
    before = [param.detach().clone() for param in params]
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            wrapper.backward(_loss(context, model, batch, cell, blow_up=batch_idx == 0))
            if (batch_idx + 1) % window == 0:
                wrapper.unscale_gradients()
                if batch_idx == len(batches) - 1:
                    assert_grads_close(
                        grads(params), prepared[1], cell, f"unscale_gradients() on {windows[1]} ({kind} Adam)"
                    )
            wrapper.step()
            outcomes.append(wrapper.last_outcome)
        if batch_idx == window - 1:
            for i, (param, old) in enumerate(zip(params, before, strict=True)):
                assert torch.equal(param.detach(), old), (
                    f"the skipped window {windows[0]} changed parameter {i} ({kind} Adam)"
                )
            _assert_skip_left_state(
                _state_entries(wrapper.optimizer),
                [{} for _ in params],
                states[0],
                cell,
                f"{kind} Adam after the window {windows[0]} skipped for an infinite loss",
            )
    want = [*[A] * (window - 1), SKIP, *[A] * (window - 1), S]
    assert outcomes == want, f"{kind} Adam: outcomes were {outcomes}, expected {want} (an overflow in micro-step 0)"
    assert_params_close(model, oracle_model, cell, f"{kind} Adam: a skipped window, then a real one")
    _assert_state_close(
        _state_entries(wrapper.optimizer), states[1], cell, f"{kind} Adam's state after the skipped and the real window"
    )


@pytest.mark.requirement("SCHED-002", "AMP-004")
@pytest.mark.features("lr_schedulers")
@pytest.mark.cells(devices=EAGER_DEVICES, precisions=("16-mixed",))
@pytest.mark.varies(
    optimizer=("Adam fused",),
    window=("1 micro-step",),
    make_optimizer_step=("None",),
    call_form=("closure, wrapper.backward",),
    loss_scale=("initial",),
)
@pytest.mark.parametrize("built_on", ["wrapper", "inner"])
def test_skipped_fused_step_does_not_make_a_scheduler_warn(
    make_context: MakeContext, cell: Cell, built_on: str
) -> None:
    """A fused Adam's skipped first step (it skips inside its inner step), then ``scheduler.step()``: no warning."""
    context = make_context()
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(_adam("fused", model.parameters(), cell))
    oracle_optimizer = _adam("fused", oracle_model.parameters(), cell)
    batch = make_batches(1)[0]
    train_windows(
        cell,
        oracle_model,
        oracle_optimizer,
        [batch],
        [[0]],
        oracle_scaler(cell),
        accumulate=1,
        factor=LOSS_FACTOR,
        blow_up=frozenset({0}),
    )
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(target, step_size=1, gamma=0.5)
        with context.batch(0):
            wrapper.step(lambda: wrapper.backward(_loss(context, model, batch, cell, True)))
        scheduler.step()
    assert wrapper.last_outcome is SKIP, f"infinite gradients gave {wrapper.last_outcome} with fused Adam"
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before, strict=True)), (
        "a skipped fused Adam step changed the parameters"
    )
    _assert_skip_left_state(
        _state_entries(wrapper.optimizer),
        [{} for _ in before],
        _state_entries(oracle_optimizer),
        cell,
        "fused Adam after a step skipped for an infinite loss",
    )


@pytest.mark.requirement("PREC-003", "ACC-001", "STEP-004")
@pytest.mark.cells(precisions=("bf16-mixed",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps",),
    make_optimizer_step=("None",),
    call_form=("closure, wrapper.backward",),
    optimizer=("SGD momentum",),
)
def test_bf16_mixed_windows_are_unscaled_and_never_skip(make_context: MakeContext, cell: Cell) -> None:
    """bf16-mixed windows of three: losses unscaled (1 reaches them), the oracle's mean, an infinite window steps."""
    context = make_context(accumulate_grad_batches=3)
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.9))
    batches = make_batches(6)
    oracle_optimizer = torch.optim.SGD(oracle_model.parameters(), lr=0.5, momentum=0.9)
    train_windows(
        cell, oracle_model, oracle_optimizer, batches, [[0, 1, 2]], None, accumulate=3, factor=CLIPPED_LOSS_FACTOR
    )
    seen: list[torch.Tensor] = []
    outcomes = []
    before: list[torch.Tensor] = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            loss = partial(_loss, context, model, batch, cell, batch_idx == 3, CLIPPED_LOSS_FACTOR)
            wrapper.step(_closure(wrapper, loss, seen))
            outcomes.append(wrapper.last_outcome)
        if batch_idx == 2:
            assert_params_close(model, oracle_model, cell, "bf16-mixed: a window of three (mean, no loss scaling)")
            before = [p.detach().clone() for p in model.parameters()]
    assert outcomes == [A, A, S, A, A, S], f"bf16-mixed has no scaler and never skips; outcomes were {outcomes}"
    scales = _scales(seen)
    assert scales == [1.0] * len(batches), f"bf16-mixed scaled its losses by {scales}; it has no loss scaler"
    assert any(not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before, strict=True)), (
        "bf16-mixed left the parameters unchanged after a window with an infinite loss: a skipped step"
    )


# -- the loss scaler outside any batch(): an update after each real step, other windows rescaled (AMP-003, AMP-006) --

OUTSIDE_ROUNDS = 4
OUTSIDE_PLANS: tuple[tuple[bool | None, ...], ...] = (
    (None, False, None, True),
    (None, None, True, None),
    (False, None, None, True),
)
"""``make_optimizer_step`` of A's, B's and C's call in each round: with ``accumulate_grad_batches`` 1 to 3 (the
schedule outside any batch counts micro-steps) windows close on every call, stay open across rounds, or are cut
short; the plan and the scale settings make the scale grow or back off after nearly every real step."""
OUTSIDE_OVERFLOW_ROUND = 1
OUTSIDE_OVERFLOWS: tuple[tuple[int, ...], ...] = ((), (0,), (1,), (0, 1))
"""The wrappers (A = 0, B = 1) whose loss is infinite in round ``OUTSIDE_OVERFLOW_ROUND``: none, A, B, both."""
OUTSIDE_ORDERS = ("atomic", "backward-all-then-step", "prepared-while-another-steps")
"""How a round calls the wrappers (A, B[, C]), outside any ``batch()``:

``atomic``: each wrapper's whole call in turn (A and C in the closure form, B backward then ``step()``);
``backward-all-then-step``: every backward, then every ``step()`` (A first), so the update after A's step meets
B's and C's gradients made at the old scale with no micro-step counted yet; ``prepared-while-another-steps``: every
backward, then ``unscale_gradients()`` of B and C where their call closes the window, then every ``step()`` (A
first): A's step must not update while B is prepared, and the update after B's step meets C's backward."""


def _assert_grads_match(
    got_grads: Iterable[torch.Tensor | None], expected: Iterable[torch.Tensor | None], cell: Cell, what: str
) -> None:
    """Every gradient is the oracle's (``None`` where its is), to the rounding of equivalent arithmetic (NaN = NaN).

    The rules fix the mean, not how it is computed (a division by the length, or a product with its inverse): the
    checks allow the rounding of either (the reordered tolerance, relative to the oracle's size), and every defect
    they target is off by a factor.
    """
    tol = REORDERED_TOLERANCES[cell.precision]
    for i, (got, want) in enumerate(zip(got_grads, expected, strict=True)):
        assert got is not None or want is None, f"{what}: parameter {i} has no gradient, the oracle's has one"
        assert got is None or want is not None, f"{what}: parameter {i} has a gradient, the oracle's has none"
        if got is None or want is None:
            continue
        mine, theirs = got.detach().cpu().double(), want.detach().cpu().double()
        size = float(theirs[theirs.isfinite()].abs().max()) if bool(theirs.isfinite().any()) else 0.0
        atol = tol.atol * max(size, 1e-30)
        assert mine.shape == theirs.shape and torch.allclose(mine, theirs, tol.rtol, atol, equal_nan=True), (
            f"{what}: the gradient of parameter {i} differs from the oracle's (its norm is "
            f"{(mine.norm() / theirs.norm()).item():.4g} x the oracle's)"
        )


class _OutsideBatchOracle(PlainWindows):
    """The plain loop outside any ``batch()``: :class:`PlainWindows` of bare SGD per part, one ``GROWING`` scaler.

    A call that closes its window takes the real step (no ``unscale_`` where ``unscale_gradients()`` prepared the
    window: its mean, unscaled). Then, unless another window is prepared, the scaler updates [AMP-003] and every
    gradient still held (windows with micro-steps, backward passes whose step has not come) follows the scale
    [AMP-006]. A prepared window postpones the update to right after its own real step.
    """

    def __init__(self, cell: Cell, parts: Sequence[torch.nn.Module], accumulate: int) -> None:
        optimizers = [torch.optim.SGD(part.parameters(), lr=LR, momentum=0.9) for part in parts]
        super().__init__(cell, optimizers, plain_scaler(cell, GROWING), accumulate)
        self.prepared: set[int] = set()
        self.unstepped: set[int] = set()  # the parts whose backward pass has run, and whose step() has not come yet
        self.last_outcomes: list[StepOutcome | None] = [None] * len(parts)
        self.facts: set[str] = set()  # what the scale changes met

    def backward(self, index: int, loss: torch.Tensor) -> None:
        super().backward(index, loss)
        self.unstepped.add(index)

    def prepare(self, index: int) -> None:
        assert self.scaler is not None
        window_mean(params_of(self.optimizers[index]), self.lengths[index], self.scaler, self.accumulate)
        self.scaler.unscale_(self.optimizers[index])
        self.prepared.add(index)

    def window(self, index: int) -> str:
        """What part ``index``'s gradients are now, in words."""
        if index in self.prepared:
            return "prepared by unscale_gradients(): the window's unscaled mean, untouched until its own step"
        micro_steps = self.lengths[index] - (index in self.unstepped)
        held = [f"{micro_steps} micro-steps"] if micro_steps else []
        held += ["a backward whose step() has not come"] if index in self.unstepped else []
        return f"at the current scale: {' and '.join(held)}" if held else "none held"

    def call_step(self, index: int, closes: bool) -> StepOutcome:
        """The ``step()`` of part ``index``'s call: its real step when ``closes``, then the update unless prepared."""
        self.unstepped.discard(index)
        outcome = A
        if closes:
            outcome = S if self.step(index, prepared=index in self.prepared) else SKIP
            self.prepared.discard(index)
        change = 1.0 if self.prepared or not closes else self.update()
        for held, length in enumerate(self.lengths):
            if change != 1.0 and length:  # without micro-steps, a backward whose step has not come: AMP-006's case
                self.facts.add("micro-steps" if length > (held in self.unstepped) else "a backward not stepped")
        self.facts |= {"grown"} if change > 1.0 else {"backed off"} if change < 1.0 else set()
        self.last_outcomes[index] = outcome
        return outcome


def _outside_batch_round(order: str, count: int, closes: Sequence[bool]) -> list[tuple[str, int]]:
    """The operations of one round of ``order`` over ``count`` wrappers (see ``OUTSIDE_ORDERS``)."""
    if order == "atomic":
        return [("call" if index % 2 == 0 else "backward-then-step", index) for index in range(count)]
    ops = [("backward", index) for index in range(count)]
    if order == "prepared-while-another-steps":
        ops += [("unscale", index) for index in range(1, count) if closes[index]]
    return ops + [("step", index) for index in range(count)]


def _outside_batch_scenario(
    make_context: MakeContext, cell: Cell, order: str, count: int, overflow: tuple[int, ...], accumulate: int
) -> set[str]:
    """One scenario of the outside-``batch()`` check against its oracle; returns what its scale changes met."""
    names = "ABC"[:count]
    scenario = (
        f"outside batch(), {order}, wrappers {names}, accumulate_grad_batches={accumulate}, infinite loss "
        f"of {''.join(names[i] for i in overflow) or 'none'} in round {OUTSIDE_OVERFLOW_ROUND}"
    )
    context = make_context(accumulate_grad_batches=accumulate, grad_scaler=GROWING)
    parts = list(context.prepare_module(_thirds()).children())[:count]
    wrappers = [context.wrap(torch.optim.SGD(part.parameters(), lr=LR, momentum=0.9)) for part in parts]
    oracle_parts = list(oracle_copy(_thirds(), cell).children())[:count]
    oracle = _OutsideBatchOracle(cell, oracle_parts, accumulate)
    oracle_leaf = torch.zeros((), device=cell_device(cell), requires_grad=True)
    batches = make_batches(OUTSIDE_ROUNDS * count, seed=5)
    seen: list[torch.Tensor] = []
    leaf = torch.zeros((), device=cell_device(cell), requires_grad=True)

    def compare(what: str) -> None:
        got = [wrapper.last_outcome for wrapper in wrappers]
        assert got == oracle.last_outcomes, (
            f"{scenario}, {what}: the last_outcome of ({names}) reads {got}, expected {oracle.last_outcomes}"
        )
        assert _scales(seen) == oracle.scales, (
            f"{scenario}, {what}: the loss scales of the backward passes so far were {_scales(seen)}, expected the "
            f"plain GradScaler's {oracle.scales} ({GROWING}; outside batch() one update right after each real "
            "step, postponed while another window is prepared by unscale_gradients())"
        )
        for index, (part, oracle_part) in enumerate(zip(parts, oracle_parts, strict=True)):
            what_of = f"{scenario}, {what}: {names[index]}'s"
            got_grads, want_grads = grads(part.parameters()), grads(oracle_part.parameters())
            _assert_grads_match(got_grads, want_grads, cell, f"{what_of} gradients ({oracle.window(index)})")
            assert_params_close(part, oracle_part, cell, f"{what_of} parameters", REORDERED_TOLERANCES[cell.precision])

    for round_idx in range(OUTSIDE_ROUNDS):
        plans = [OUTSIDE_PLANS[index][round_idx] for index in range(count)]
        closes = [oracle.lengths[i] + 1 >= accumulate if plan is None else plan for i, plan in enumerate(plans)]
        for op, index in _outside_batch_round(order, count, closes):
            wrapper, plan, batch = wrappers[index], plans[index], batches[round_idx * count + index]
            blow_up = round_idx == OUTSIDE_OVERFLOW_ROUND and index in overflow
            loss = partial(_loss, context, parts[index], batch, cell, blow_up)
            if op in ("backward", "backward-then-step"):
                wrapper.backward(_hooked(loss(), seen))
            if op in ("call", "backward", "backward-then-step"):
                oracle.backward(index, oracle_loss(oracle_parts[index], batch, cell, blow_up))
            if op == "unscale":
                wrapper.unscale_gradients()
                oracle.prepare(index)
            elif op == "call":
                wrapper.step(_closure(wrapper, loss, seen), make_optimizer_step=plan)
            elif op != "backward":
                wrapper.step(make_optimizer_step=plan)
            real = op not in ("backward", "unscale") and oracle.call_step(index, closes[index]) is not A
            if real and not oracle.prepared:
                probe = _hooked(leaf * 1.0, seen)  # the scale after this step: the gradient reaching a probe loss
                wrappers[0].backward(probe, inputs=[leaf])
                scaled_backward(oracle_leaf * 1.0, oracle.scaler, accumulate, scales=oracle.scales)
            compare(f"round {round_idx}, after {names[index]}'s {op} (make_optimizer_step={plan})")
    return oracle.facts


@pytest.mark.requirement("AMP-003", "AMP-006", "AMP-004", "STEP-003", "STEP-004", "CLIP-002")
# Growth needs other scaler settings than the first scaler's, which torch_xla bakes into its compiled update.
@pytest.mark.cells(devices=EAGER_DEVICES, precisions=("16-mixed",))
@pytest.mark.varies(
    position=("outside batch()",),
    wrappers=("2", "3"),
    window=(
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "open while another optimizer steps",
        "open across a scale change",
    ),
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    loss_scale=("backed off", "grown", "settings given to the factory"),
    optimizer=("SGD momentum",),
    outcome_read=("after every call of every wrapper",),
)
@pytest.mark.parametrize("order", OUTSIDE_ORDERS)
def test_outside_batch_each_real_step_updates_the_scale(make_context: MakeContext, cell: Cell, order: str) -> None:
    """Outside any ``batch()``: after each real step the scaler updates once, and every other held gradient follows.

    For 2 and 3 wrappers, ``accumulate_grad_batches`` 1 to 3, and an infinite loss in A, B, both or neither, four
    rounds of ``order`` (``OUTSIDE_ORDERS``) with the calls of ``OUTSIDE_PLANS``. After every call of every wrapper:
    each wrapper's ``last_outcome``, the loss scale of every backward pass (and of a probe backward after each real
    step), every gradient and every parameter are the oracle's (:class:`_OutsideBatchOracle`), to the rounding of
    equivalent arithmetic. A window that another optimizer's update finds holding gradients (micro-steps, or a
    backward whose step has not come) is rescaled to the new scale; a window prepared by ``unscale_gradients()``
    keeps its unscaled mean, is not unscaled again, and postpones the update to right after its own real step.
    """
    met: set[str] = set()
    for count, overflow, accumulate in itertools.product((2, 3), OUTSIDE_OVERFLOWS, (1, 2, 3)):
        met |= _outside_batch_scenario(make_context, cell, order, count, overflow, accumulate)
    wanted = {"grown", "backed off", "micro-steps"} | ({"a backward not stepped"} if order != "atomic" else set())
    assert wanted <= met, f"the check's own scenarios ({order}) met only {sorted(met)} of {sorted(wanted)}"


# -- unscale_gradients(): the window's mean over its full length (CLIP-002) --------------------------------------

DIVISOR_CLOSINGS = ("schedule", "true", "last")
"""How the window closes: ``schedule``: by ``make_optimizer_step=None`` with ``accumulate_grad_batches`` equal to the
window's length; ``true``: cut short by ``make_optimizer_step=True`` (``accumulate_grad_batches`` one more); ``last``:
flushed by the last batch of an epoch, ``is_last=True`` (``accumulate_grad_batches`` one more)."""


def _divisor_case(make_context: MakeContext, cell: Cell, closing: str, length: int, form: str, inside: bool) -> None:
    """Two windows of ``length`` micro-steps closed as ``closing`` says, ``unscale_gradients()`` in ``form``."""
    case = (
        f"{'in' if inside else 'out'}side batch(), windows of {length} closed by {closing}, unscale_gradients() {form}"
    )
    accumulate = length if closing == "schedule" else length + 1
    context = make_context(accumulate_grad_batches=accumulate, **scaler_settings(cell, SMALL_SCALE))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=CLIP_LR))
    oracle_optimizer = torch.optim.SGD(oracle_model.parameters(), lr=CLIP_LR)
    scaler = plain_scaler(cell, SMALL_SCALE)
    batches = make_batches(2 * length, seed=3)
    got: list[list[torch.Tensor | None]] = []
    want: list[list[torch.Tensor | None]] = []

    def inspect_then_clip(into: list[list[torch.Tensor | None]], params: list[torch.Tensor]) -> None:
        into.append(grads(params))
        clipper("norm", HAND_CLIP)(params)

    def unscale_inspect_clip(loss: Callable[[], torch.Tensor]) -> None:
        wrapper.backward(loss())
        wrapper.unscale_gradients()
        inspect_then_clip(got, list(model.parameters()))

    for window_idx in range(2):
        window = [window_idx * length + position for position in range(length)]
        for position, batch_idx in enumerate(window):
            closes, flag = position == length - 1, True if closing == "true" else None
            loss = partial(_loss, context, model, batches[batch_idx], cell, factor=CLIPPED_LOSS_FACTOR)
            block = context.batch(position, is_last=closing == "last" and closes) if inside else nullcontext()
            with block:
                if not closes and position % 2 == 0:
                    wrapper.step(_closure(wrapper, loss))
                elif not closes:
                    wrapper.backward(loss())
                    wrapper.step()
                elif form == "in the closing step's closure":
                    wrapper.step(partial(unscale_inspect_clip, loss), make_optimizer_step=flag)
                else:
                    unscale_inspect_clip(loss)
                    wrapper.step(make_optimizer_step=flag)
                outcome = wrapper.last_outcome
            assert outcome is (S if closes else A), (
                f"{case}, window {window_idx}, micro-step {position}: outcome {outcome}, expected {S if closes else A}"
            )
        runs = len(got) - window_idx
        assert runs == 1, f"{case}, window {window_idx}: the closing closure ran {runs} times, not once"
        train_windows(
            *(cell, oracle_model, oracle_optimizer, batches, [window], scaler),
            accumulate=accumulate,
            factor=CLIPPED_LOSS_FACTOR,
            after_prepare=partial(inspect_then_clip, want),
        )
        unscaled = ", unscaled" if cell.precision == "16-mixed" else ""
        _assert_grads_match(
            got[window_idx],
            want[window_idx],
            cell,
            f"{case}, window {window_idx}: the gradients right after unscale_gradients() (the sum of the window's "
            f"{length} micro-batch gradients / {length}{unscaled}, as the plain loop's; accumulate_grad_batches="
            f"{accumulate})",
        )
        what = f"{case}: after clip_grad_norm_({HAND_CLIP}) and the step closing window {window_idx}"
        assert_params_close(model, oracle_model, cell, what, REORDERED_TOLERANCES[cell.precision])


@pytest.mark.requirement("CLIP-002", "ACC-001", "AMP-002", "STEP-003")
@pytest.mark.cells(devices=EAGER_DEVICES)
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "None"),
    position=("inside batch()", "outside batch()"),
    call_form=("closure, wrapper.backward", "backward, then step()"),
    clipping=("unscale_gradients() by hand",),
    loss_scale=("settings given to the factory",),
    optimizer=("SGD",),
)
@pytest.mark.parametrize("closing", DIVISOR_CLOSINGS)
def test_unscale_gradients_divides_by_the_full_window(make_context: MakeContext, cell: Cell, closing: str) -> None:
    """``unscale_gradients()`` before the closing step leaves the mean over the window's full length.

    Windows of 1 to 4 micro-steps (the earlier ones alternate the closure and the backward-then-step form), inside
    and outside ``batch()`` (the last batch of an epoch only inside), closed as ``closing`` says
    (``DIVISOR_CLOSINGS``); ``unscale_gradients()`` inside the closing step's closure, or between the closing
    micro-step's backward and a closure-less ``step()``. Right after it the gradients are the oracle's sum of the
    window's gradients divided by its length (the accumulated micro-steps and the closing one), unscaled under
    16-mixed (to the rounding of equivalent arithmetic); then a hand-written ``clip_grad_norm_``, and after the
    closing step the parameters are the oracle's. A second window follows, so the count restarts after a prepared step.
    """
    forms = ("in the closing step's closure", "between backward and step()")
    for length, form, inside in itertools.product(range(1, 5), forms, (True, False)):
        if closing == "last" and not inside:
            continue  # only a batch() is the last of an epoch
        _divisor_case(make_context, cell, closing, length, form, inside)
