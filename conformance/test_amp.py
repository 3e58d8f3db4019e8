"""Checks of the mixed and low precisions: loss scaling, skipped steps, unscaling, clipping, bf16."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from functools import partial
from typing import Any, Literal, cast

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    assert_grads_close,
    assert_same_grads,
    assert_same_values,
    assert_state_close,
    grads,
    optimizer_states,
    param_values,
)
from lightning_optimizer.conformance.harness import (
    REORDERED_TOLERANCES,
    Halves,
    assert_params_close,
    call_step,
    cell_device,
    context_loss,
    make_batches,
    make_model,
    oracle_autocast,
    oracle_scaler,
    refuses,
    run_steps,
    scaler_settings,
)
from lightning_optimizer.conformance.oracles import WindowOracle, expected_outcomes, oracle_copy
from lightning_optimizer.conformance.plain_loop import (
    PlainWindows,
    clipper,
    oracle_loss,
    plain_scaler,
    scaled_backward,
    train_windows,
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
    optimizers = [torch.optim.SGD(half.parameters(), lr=LR, momentum=0.9) for half in (oracle.a, oracle.b)]
    loop = PlainWindows(cell, optimizers, oracle_scaler(cell))
    a_before = [p.detach().clone() for p in model.a.parameters()]
    batches = make_batches(3)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        blow_up = batch_idx == 0
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            opt_a.backward(context_loss(context, model.a, batch, cell, blow_up))
            opt_b.backward(context_loss(context, model.b, batch, cell))
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
        loop.backward(0, oracle_loss(oracle.a, batch, cell, blow_up))
        loop.backward(1, oracle_loss(oracle.b, batch, cell))
        for index in (0, 1):  # each optimizer's unscale_ and step, then one update for the iteration
            loop.step(index)
        loop.update()
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
            call_step(opt_a, "closure", partial(context_loss, context, model.a, batch, cell), batch_idx == 1)
            if batch_idx == 0:
                call_step(opt_b, "closure", partial(context_loss, context, model.b, batch, cell, True), True)
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
            wrapper.backward(context_loss(context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            wrapper.unscale_gradients()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.05)
            wrapper.step(make_optimizer_step=True)
    oracle = oracle_copy(make_model(), cell)
    window_oracle = WindowOracle(oracle, torch.optim.SGD(oracle.parameters(), lr=0.5), cell)
    window_oracle.train_windows(batches, [[0], [1], [2]], factor=CLIPPED_LOSS_FACTOR, clip=clipper("norm", 0.05))
    assert_params_close(model, oracle, cell, "unscale_gradients(), clip_grad_norm_(0.05), step()")
    wrapper.backward(context_loss(context, model, batches[0], cell))
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
        wrapper.backward(context_loss(context, model, batches[1], cell))
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
            loss = partial(context_loss, context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            call_step(wrapper, "closure", loss)
    oracle = oracle_copy(make_model(), cell)
    window_oracle = WindowOracle(oracle, torch.optim.SGD(oracle.parameters(), lr=0.5), cell)
    window_oracle.train_windows(batches, [[0], [1], [2]], factor=CLIPPED_LOSS_FACTOR, clip=clipper(algorithm, 0.02))
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
            wrapper.step(lambda: wrapper.backward(context_loss(context, model, make_batches(1)[0], cell, True)))
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
    wrapper.backward(context_loss(context, model, batch, cell))
    oracle_loss(oracle, batch, cell).backward()
    for got, want in zip(model.parameters(), oracle.parameters(), strict=True):
        assert got.grad is not None and want.grad is not None
        torch.testing.assert_close(got.grad, want.grad, msg="bf16-mixed scaled or changed the gradient")
    wrapper.zero_grad()
    wrapper.step(lambda: wrapper.backward(context_loss(context, model, batch, cell, True)), make_optimizer_step=True)
    assert wrapper.last_outcome is S, f"bf16-mixed has no scaler and never skips; got {wrapper.last_outcome}"


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

ADAM_KINDS: dict[str, dict[str, Any]] = {"fused": {"fused": True}, "foreach": {"foreach": True}}
"""torch's fused and foreach Adam, by ``kind`` (the checks that use them run on cpu and cuda, where both exist)."""

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
            loss = partial(context_loss, context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            call_step(wrapper, "closure", loss, CLIP_SCHEDULE[batch_idx])
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


def _grouped_sgd(part: torch.nn.Sequential, wrap: Callable[[torch.optim.SGD], Any]) -> Any:
    """SGD in three groups of other hyper-parameters: the first layer, the last's weight, its bias added after wrap."""
    first, _, last = part
    groups: list[dict[str, Any]] = [{"params": list(first.parameters())}]
    groups.append({"params": [last.weight], "lr": 2.0, "momentum": 0.9})
    optimizer = wrap(torch.optim.SGD(groups, lr=CLIP_LR))
    optimizer.add_param_group({"params": [last.bias], "lr": 1.0, "momentum": 0.5})
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
    optimizers = [
        _grouped_sgd(oracle.a, lambda optimizer: optimizer),
        torch.optim.SGD(oracle.b.parameters(), lr=CLIP_LR),
    ]
    loop = PlainWindows(cell, optimizers, plain_scaler(cell, SMALL_SCALE))
    clip = clipper("norm", CLIP_VALUE)
    batches = make_batches(3)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        b_closes = batch_idx == len(batches) - 1
        with context.batch(batch_idx, is_last=b_closes):
            loss_b = partial(context_loss, context, model.b, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            call_step(opt_b, "closure", loss_b, b_closes)
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            b_before = None if b_closes else grads(model.b.parameters())
            loss_a = partial(context_loss, context, model.a, batch, cell, factor=CLIPPED_LOSS_FACTOR)
            call_step(opt_a, "closure", loss_a)
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            if b_before is not None:
                assert_same_grads(
                    grads(model.b.parameters()), b_before, f"batch {batch_idx}: B's open window across A's clipped step"
                )
        for index, half in ((1, oracle.b), (0, oracle.a)):  # B's micro-step (its real step in the last batch), A's
            loop.backward(index, oracle_loss(half, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            if index == 0 or b_closes:
                loop.step(index, clip)
        loop.update()
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
            wrapper.backward(context_loss(context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR))
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
    optimizers = [
        torch.optim.SGD(half.parameters(), lr=CLIP_LR, momentum=m) for half, m in ((oracle.a, 0), (oracle.b, 0.9))
    ]
    loop = PlainWindows(cell, optimizers, plain_scaler(cell, SMALL_SCALE))
    plan = zip(make_batches(4), (False, True, False, True), (False, False, True, True), strict=True)  # A, B close
    outcomes = []
    got: list[list[torch.Tensor | None]] = []  # A's gradients right after its unscale_gradients()
    want: list[list[torch.Tensor | None]] = []  # the plain loop's, as each real step prepared them

    def unscale_a() -> None:
        opt_a.unscale_gradients()
        got.append(grads(model.a.parameters()))

    for batch_idx, (batch, closes, b_closes) in enumerate(plan):
        loss_a = partial(context_loss, context, model.a, batch, cell, factor=CLIPPED_LOSS_FACTOR)
        with context.batch(batch_idx, is_last=batch_idx == 3):
            opt_b.backward(context_loss(context, model.b, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            opt_b.step(make_optimizer_step=b_closes)
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
            b_open = [] if b_closes else list(model.b.parameters())
            b_before = grads(b_open)
            if batch_idx == 3:  # A closes in the closure form: its backward and unscale_gradients() inside the closure
                call_step(opt_a, "closure", loss_a, True, then=unscale_a)
            else:
                opt_a.backward(loss_a())
                if closes:
                    unscale_a()
                after = "unscale_gradients()" if closes else "backward"
                assert_same_grads(grads(b_open), b_before, f"batch {batch_idx}: B's open window after A's {after}")
                opt_a.step(make_optimizer_step=closes)
            assert_same_grads(grads(b_open), b_before, f"batch {batch_idx}: B's open window after A's step")
            outcomes.append((opt_a.last_outcome, opt_b.last_outcome))
        for index, half, closing in ((1, oracle.b, b_closes), (0, oracle.a, closes)):  # B's micro-step, then A's
            loop.backward(index, oracle_loss(half, batch, cell, factor=CLIPPED_LOSS_FACTOR))
            length = loop.lengths[index]  # A's window's, in the end
            if closing:
                loop.step(index, clipper("norm", CLIP_VALUE), lambda params: want.append(grads(params)))
        loop.update()
        if closes:
            form = "backward, then" if batch_idx == 1 else "in the closure of"
            what = f"batch {batch_idx}: A's gradients after unscale_gradients() ({form} the closing step): the mean of "
            what += f"{length} micro-steps, unscaled, clipped to norm {CLIP_VALUE} as configured"
            assert_grads_close(got[-1], want[-1], cell, what)
    want_outcomes = [(None, A), (A, A), (A, A), (S, A), (S, S), (A, S), (A, S), (S, S)]
    assert outcomes == want_outcomes, f"(A, B) outcomes after each call were {outcomes}, expected {want_outcomes}"
    assert_params_close(model.a, oracle.a, cell, "A: windows of two, unscale_gradients() then step()")
    assert_params_close(model.b, oracle.b, cell, "B: a window of three open across A's unscale_gradients(), then one")


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
    The factor of each backward (the gradient reaching the loss) is the plain loop's (:class:`PlainWindows`, one
    ``GROWING`` scaler): its scale, updated once per iteration after every optimizer that stepped and growing when
    none overflowed, over ``accumulate_grad_batches``.
    """
    context = make_context(accumulate_grad_batches=3, grad_scaler=GROWING)
    parts = list(context.prepare_module(_thirds()).children())
    opts = [context.wrap(torch.optim.SGD(p.parameters(), lr=GROWTH_LR, momentum=0.9)) for p in parts]
    oracle = list(oracle_copy(_thirds(), cell).children())
    optimizers = [torch.optim.SGD(part.parameters(), lr=GROWTH_LR, momentum=0.9) for part in oracle]
    loop = PlainWindows(cell, optimizers, plain_scaler(cell, GROWING), 3)
    a_plan: dict[int, bool | None] = {0: None, 1: None, 3: True}  # A's make_optimizer_step; idle in batch 2
    scales: list[float] = []
    outcomes = []
    for batch_idx, batch in enumerate(make_batches(4)):
        blow_up = [False, batch_idx == 1, False]
        losses = [
            partial(context_loss, context, part, batch, cell, blow_up[i], GROWTH_LOSS_FACTOR, scales=scales)
            for i, part in enumerate(parts)
        ]
        with context.batch(batch_idx, is_last=batch_idx == 3):
            if batch_idx in a_plan:
                call_step(opts[0], "closure", losses[0], a_plan[batch_idx])
                outcomes.append(tuple(opt.last_outcome for opt in opts))
            for index in (1, 2):
                opts[index].backward(losses[index]())
            for index in (1, 2):
                opts[index].step(make_optimizer_step=True)
                outcomes.append(tuple(opt.last_outcome for opt in opts))
        for index in (0, 1, 2) if batch_idx in a_plan else (1, 2):
            loop.backward(index, oracle_loss(oracle[index], batch, cell, blow_up[index], GROWTH_LOSS_FACTOR))
        for index in (0, 1, 2) if batch_idx == 3 else (1, 2):  # A's window closes in batch 3
            loop.step(index)
        loop.update()
    want_outcomes = [  # (A, B, C) after each call, worked by hand
        *((A, None, None), (A, S, None), (A, S, S)),  # batch 0
        *((A, S, S), (A, SKIP, S), (A, SKIP, S)),  # batch 1: B overflows
        *((A, S, S), (A, S, S)),  # batch 2: A idle
        *((S, S, S), (S, S, S), (S, S, S)),  # batch 3: A's window of three closes
    ]
    assert outcomes == want_outcomes, f"(A, B, C) outcomes after each call were {outcomes}, expected {want_outcomes}"
    assert scales == loop.scales, (
        f"the loss scales of the backward passes (A, B, C per batch; A idle in batch 2) were {scales}, expected "
        f"the plain GradScaler's {loop.scales} ({GROWING}: one update per iteration, growth after each "
        "without an overflow; each loss divided by accumulate_grad_batches=3 first, AMP-007)"
    )
    assert_params_close(parts[0], oracle[0], cell, "A: a window of three open across growth, back-off and growth")
    assert_params_close(parts[1], oracle[1], cell, "B: steps every batch, skipped in batch 1")
    assert_params_close(parts[2], oracle[2], cell, "C: steps every batch after B's overflow in the same iteration")


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
    not count: after the next window, Adam's step count and moments are the plain fused or foreach Adam's. The plain
    loop (:class:`PlainWindows`, a default scaler) runs alongside, ``unscale_`` where ``unscale_gradients()`` runs.
    """
    context = make_context(accumulate_grad_batches=window)
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.05, **ADAM_KINDS[kind]))
    oracle_optimizer = torch.optim.Adam(oracle_model.parameters(), lr=0.05, **ADAM_KINDS[kind])
    loop = PlainWindows(cell, [oracle_optimizer], oracle_scaler(cell), window)
    batches = make_batches(2 * window)
    windows = [list(range(window)), list(range(window, 2 * window))]
    params = list(model.parameters())
    before = param_values(params)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        closes, last = (batch_idx + 1) % window == 0, batch_idx == len(batches) - 1
        loop.backward(0, oracle_loss(oracle_model, batch, cell, batch_idx == 0))
        if closes:
            loop.prepare(0)
        with context.batch(batch_idx, is_last=last):
            wrapper.backward(context_loss(context, model, batch, cell, batch_idx == 0))
            if closes:
                wrapper.unscale_gradients()
                if last:
                    what = f"unscale_gradients() on {windows[1]} ({kind} Adam)"
                    assert_grads_close(grads(params), grads(oracle_model.parameters()), cell, what)
            wrapper.step()
            outcomes.append(wrapper.last_outcome)
        if closes:
            loop.step(0)
            loop.update()
        if batch_idx == window - 1:
            assert_same_values(param_values(params), before, f"the skipped window {windows[0]} ({kind} Adam)")
            state = optimizer_states(wrapper.optimizer)
            if any(state):  # not as before the skip: fused Adam's inner step skips inside, its state at step 0
                what = f"{kind} Adam after the window {windows[0]} skipped for an infinite loss (not as before it)"
                assert_state_close(state, optimizer_states(oracle_optimizer), cell, what)
    want = [*[A] * (window - 1), SKIP, *[A] * (window - 1), S]
    assert outcomes == want, f"{kind} Adam: outcomes were {outcomes}, expected {want} (an overflow in micro-step 0)"
    assert_params_close(model, oracle_model, cell, f"{kind} Adam: a skipped window, then a real one")
    what = f"{kind} Adam's state after the skipped and the real window"
    assert_state_close(optimizer_states(wrapper.optimizer), optimizer_states(oracle_optimizer), cell, what)


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
    wrapper = context.wrap(torch.optim.Adam(model.parameters(), lr=0.05, **ADAM_KINDS["fused"]))
    oracle_optimizer = torch.optim.Adam(oracle_model.parameters(), lr=0.05, **ADAM_KINDS["fused"])
    batch = make_batches(1)[0]
    train_windows(cell, oracle_model, oracle_optimizer, [batch], [[0]], oracle_scaler(cell), blow_up=frozenset({0}))
    before = [p.detach().clone() for p in model.parameters()]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        target = cast(torch.optim.Optimizer, wrapper) if built_on == "wrapper" else wrapper.optimizer
        scheduler = torch.optim.lr_scheduler.StepLR(target, step_size=1, gamma=0.5)
        with context.batch(0):
            wrapper.step(lambda: wrapper.backward(context_loss(context, model, batch, cell, True)))
        scheduler.step()
    assert wrapper.last_outcome is SKIP, f"infinite gradients gave {wrapper.last_outcome} with fused Adam"
    assert all(torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before, strict=True)), (
        "a skipped fused Adam step changed the parameters"
    )
    state = optimizer_states(wrapper.optimizer)
    if any(state):  # not as before the skip: fused Adam's inner step skips inside, its state at step 0
        what = "fused Adam after a step skipped for an infinite loss (its state not as before the step)"
        assert_state_close(state, optimizer_states(oracle_optimizer), cell, what)


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
    seen: list[float] = []
    outcomes = []
    before: list[torch.Tensor] = []
    for batch_idx, batch in enumerate(batches):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            loss = partial(context_loss, context, model, batch, cell, batch_idx == 3, CLIPPED_LOSS_FACTOR, scales=seen)
            call_step(wrapper, "closure", loss)
            outcomes.append(wrapper.last_outcome)
        if batch_idx == 2:
            assert_params_close(model, oracle_model, cell, "bf16-mixed: a window of three (mean, no loss scaling)")
            before = [p.detach().clone() for p in model.parameters()]
    assert outcomes == [A, A, S, A, A, S], f"bf16-mixed has no scaler and never skips; outcomes were {outcomes}"
    assert seen == [1.0] * len(batches), f"bf16-mixed scaled its losses by {seen}; it has no loss scaler"
    assert any(not torch.equal(p.detach(), q) for p, q in zip(model.parameters(), before, strict=True)), (
        "bf16-mixed left the parameters unchanged after a window with an infinite loss: a skipped step"
    )


# -- the loss scaler outside any batch(): an update after each real step, other windows rescaled (AMP-003, AMP-006) --

OUTSIDE_ROUNDS = 4
HELD = ("a backward not stepped", "micro-steps")
"""What a window holds when the scale changes: only a backward whose ``step()`` has not come, or micro-steps."""
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
first): A's step must not update while B is prepared, and the update after B's step meets C's backward.

A round's operations: ``closure`` (a whole call in the closure form), or a call's parts, each checked on its own:
``backward`` (the wrapper's), ``unscale_gradients()`` and ``step()`` (closure-less)."""


def _outside_batch_round(order: str, count: int, closes: Sequence[bool]) -> list[tuple[str, int]]:
    """The operations of one round of ``order`` over ``count`` wrappers (see ``OUTSIDE_ORDERS``)."""
    if order == "atomic":
        return [(op, i) for i in range(count) for op in (("closure",) if i % 2 == 0 else ("backward", "step()"))]
    prepared = [i for i in range(1, count) if closes[i]] if order == "prepared-while-another-steps" else []
    ops = [("backward", i) for i in range(count)] + [("unscale_gradients()", i) for i in prepared]
    return ops + [("step()", index) for index in range(count)]


def _outside_batch_scenario(
    make_context: MakeContext, cell: Cell, order: str, count: int, overflow: tuple[int, ...], accumulate: int
) -> set[str]:
    """One scenario of the outside-``batch()`` check against :class:`PlainWindows`; returns what its updates met.

    A call that closes its window takes the real step (of the mean ``unscale_gradients()`` prepared, as it is); then,
    unless another window is prepared, the scaler updates [AMP-003] and every gradient still held follows [AMP-006].
    """
    names = "ABC"[:count]
    scenario = (
        f"outside batch(), {order}, wrappers {names}, accumulate_grad_batches={accumulate}, infinite loss "
        f"of {''.join(names[i] for i in overflow) or 'none'} in round {OUTSIDE_OVERFLOW_ROUND}"
    )
    context = make_context(accumulate_grad_batches=accumulate, grad_scaler=GROWING)
    parts = list(context.prepare_module(_thirds()).children())[:count]
    wrappers = [context.wrap(torch.optim.SGD(part.parameters(), lr=LR, momentum=0.9)) for part in parts]
    oracle_parts = list(oracle_copy(_thirds(), cell).children())[:count]
    optimizers = [torch.optim.SGD(part.parameters(), lr=LR, momentum=0.9) for part in oracle_parts]
    loop = PlainWindows(cell, optimizers, plain_scaler(cell, GROWING), accumulate)
    leaf, oracle_leaf = (torch.zeros((), device=cell_device(cell), requires_grad=True) for _ in range(2))
    batches = make_batches(OUTSIDE_ROUNDS * count, seed=5)
    seen: list[float] = []
    met: set[str] = set()
    outcomes: list[StepOutcome | None] = [None] * count
    for round_idx in range(OUTSIDE_ROUNDS):
        plans = [OUTSIDE_PLANS[index][round_idx] for index in range(count)]
        closes = [loop.lengths[i] + 1 >= accumulate if plan is None else plan for i, plan in enumerate(plans)]
        for op, index in _outside_batch_round(order, count, closes):
            wrapper, plan, batch = wrappers[index], plans[index], batches[round_idx * count + index]
            blow_up = round_idx == OUTSIDE_OVERFLOW_ROUND and index in overflow
            loss = partial(context_loss, context, parts[index], batch, cell, blow_up, scales=seen)
            if op == "closure":
                call_step(wrapper, "closure", loss, plan)
            elif op == "backward":
                wrapper.backward(loss())
            elif op == "step()":
                wrapper.step(make_optimizer_step=plan)
            else:
                wrapper.unscale_gradients()
                loop.prepare(index)
            if op in ("closure", "backward"):
                loop.backward(index, oracle_loss(oracle_parts[index], batch, cell, blow_up))
            if op in ("closure", "step()"):
                outcomes[index] = (S if loop.step(index) else SKIP) if closes[index] else A
            if op in ("closure", "step()") and closes[index] and not loop.prepared:  # the update right after it
                change = loop.update()
                if change != 1.0:  # what the rescale met: windows with micro-steps, or only a backward not stepped yet
                    pending = range(index + 1, count) if order != "atomic" else ()
                    met |= {"grown" if change > 1.0 else "backed off"}
                    met |= {HELD[n > (i in pending)] for i, n in enumerate(loop.lengths) if n}
                probe = leaf * 1.0  # the scale now: the gradient that reaches a probe loss
                probe.register_hook(lambda grad: seen.append(float(grad)))
                wrappers[0].backward(probe, inputs=[leaf])
                scaled_backward(oracle_leaf * 1.0, loop.scaler, accumulate, scales=loop.scales)
            what = f"{scenario}, round {round_idx}, after {names[index]}'s {op} (make_optimizer_step={plan})"
            read = [each.last_outcome for each in wrappers]
            assert read == outcomes, f"{what}: the last_outcome of ({names}) reads {read}, expected {outcomes}"
            assert seen == loop.scales, (
                f"{what}: the backward passes' loss scales were {seen}, the plain GradScaler's {loop.scales} ({GROWING}"
                "; outside batch() an update right after each real step, none while another window is prepared)"
            )
            for i, (part, oracle_part) in enumerate(zip(parts, oracle_parts, strict=True)):
                held_now = "prepared" if i in loop.prepared else f"{loop.lengths[i]} backward passes held"
                got, want = grads(part.parameters()), grads(oracle_part.parameters())
                assert_grads_close(got, want, cell, f"{what}: {names[i]}'s gradients ({held_now})", reordered=True)
                what_of = f"{what}: {names[i]}'s parameters"
                assert_params_close(part, oracle_part, cell, what_of, REORDERED_TOLERANCES[cell.precision])
    return met


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
    rounds of ``order`` (``OUTSIDE_ORDERS``) with the calls of ``OUTSIDE_PLANS``. After every call (and every part of
    one) of every wrapper: each wrapper's ``last_outcome``, the loss scale of every backward pass (and of a probe
    backward after each real step), every gradient and every parameter are the plain loop's (:class:`PlainWindows`,
    one ``GROWING`` scaler), to the rounding of equivalent arithmetic. A window that another optimizer's update finds
    holding gradients (micro-steps, or a backward whose step has not come) is rescaled to the new scale; a window
    prepared by ``unscale_gradients()`` keeps its unscaled mean, is not unscaled again, and postpones the update to
    right after its own real step.
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
DIVISOR_FORMS: dict[str, Literal["closure", "backward"]] = {
    "in the closing step's closure": "closure",
    "between backward and step()": "backward",
}
"""Where the closing micro-step calls ``unscale_gradients()``, and the call form that puts it there."""


def _divisor_case(make_context: MakeContext, cell: Cell, closing: str, length: int, form: str, inside: bool) -> None:
    """Two windows of ``length`` micro-steps closed as ``closing`` says, ``unscale_gradients()`` in ``form``."""
    side = "inside" if inside else "outside"
    case = f"{side} batch(), windows of {length} closed by {closing}, unscale_gradients() {form}"
    accumulate = length if closing == "schedule" else length + 1
    context = make_context(accumulate_grad_batches=accumulate, **scaler_settings(cell, SMALL_SCALE))
    base = make_model()
    oracle_model = oracle_copy(base, cell)
    model = context.prepare_module(base)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=CLIP_LR))
    optimizer = torch.optim.SGD(oracle_model.parameters(), lr=CLIP_LR)
    loop = PlainWindows(cell, [optimizer], plain_scaler(cell, SMALL_SCALE), accumulate)
    clip, flag = clipper("norm", HAND_CLIP), True if closing == "true" else None
    got: list[list[torch.Tensor | None]] = []

    def unscale_inspect_clip() -> None:  # the closing micro-step's unscale_gradients(), then a hand-written clip
        wrapper.unscale_gradients()
        got.append(grads(model.parameters()))
        clip(list(model.parameters()))

    for batch_idx, batch in enumerate(make_batches(2 * length, seed=3)):
        window_idx, position = divmod(batch_idx, length)
        closes, where = position == length - 1, f"{case}, window {window_idx}"
        loss = partial(context_loss, context, model, batch, cell, factor=CLIPPED_LOSS_FACTOR)
        with context.batch(position, is_last=closing == "last" and closes) if inside else nullcontext():
            if closes:
                call_step(wrapper, DIVISOR_FORMS[form], loss, flag, then=unscale_inspect_clip)
            else:  # the earlier micro-steps alternate the closure and the backward-then-step form
                call_step(wrapper, "closure" if position % 2 == 0 else "backward", loss)
            outcome = wrapper.last_outcome
        want = S if closes else A
        assert outcome is want, f"{where}, micro-step {position}: outcome {outcome}, expected {want}"
        loop.backward(0, oracle_loss(oracle_model, batch, cell, factor=CLIPPED_LOSS_FACTOR))
        if closes:
            assert len(got) == window_idx + 1, f"{where}: the closing closure ran {len(got) - window_idx} times"
            loop.prepare(0)
            unscaled = ", unscaled" if cell.precision == "16-mixed" else ""
            what = f"{where}: right after unscale_gradients(), the sum of the window's {length} micro-batch gradients"
            what += f" / {length}{unscaled} (as the plain loop's; accumulate_grad_batches={accumulate})"
            assert_grads_close(got[window_idx], grads(oracle_model.parameters()), cell, what, reordered=True)
            loop.step(0, clip)
            loop.update()
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
    for length, form, inside in itertools.product(range(1, 5), DIVISOR_FORMS, (True, False)):
        if closing == "last" and not inside:
            continue  # only a batch() is the last of an epoch
        _divisor_case(make_context, cell, closing, length, form, inside)
