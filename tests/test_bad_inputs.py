"""The reference against bad input and failing calls: each is refused (or fails) and changes nothing.

Every case starts from the same training state: 16-mixed (or 32-true), two SGD optimizers over one model, each
with an open window of one micro-step inside ``batch(1)`` of ``accumulate_grad_batches=3``, and the failure policy
that restores a failed call's window exactly (``on_failure="restore"``: the refusals change nothing under either
policy; the failures after a backward are what the conformance suite's failure checks hold to both). The case makes
one bad call; the test compares everything before and after it: parameters, gradients, ``requires_grad`` flags,
outcomes, the optimizers' and the context's state dicts and the loss scale. Then the same state must still train:
the window closes on time and its real step applies the true mean (checked against a plain loop).
"""

from __future__ import annotations

import copy
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.oracles import recipe_backward, recipe_window_mean
from lightning_optimizer.reference import TrainingContext, WrappedOptimizer, torch_compat
from lightning_optimizer.spec import Precision, StepOutcome


class FailingSGD(torch.optim.SGD):
    """SGD whose step raises while ``fail`` is set (before it changes anything)."""

    fail = False

    def step(self, closure: Any = None) -> Any:
        if self.fail:
            raise RuntimeError("the inner step fails on purpose")
        return super().step(closure)


@dataclass
class State:
    ctx: TrainingContext
    model: torch.nn.Sequential
    opts: list[WrappedOptimizer[Any]]
    x: torch.Tensor


def _state(precision: Precision) -> State:
    torch.manual_seed(0)
    ctx = TrainingContext(precision, accumulate_grad_batches=3, gradient_clip_val=10.0, on_failure="restore")
    model = ctx.prepare_module(torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)))
    assert isinstance(model, torch.nn.Sequential)
    opts: list[WrappedOptimizer[Any]] = [
        ctx.wrap(FailingSGD(model[0].parameters(), lr=0.1)),
        ctx.wrap(torch.optim.SGD(model[1].parameters(), lr=0.1)),
    ]
    x = torch.randn(8, 4)
    with ctx.batch(0):
        for opt in opts:
            opt.step(_closure(ctx, model, opt, x))
    return State(ctx, model, opts, x)


def _closure(ctx: TrainingContext, model: torch.nn.Module, opt: WrappedOptimizer[Any], x: torch.Tensor) -> Any:
    def closure() -> torch.Tensor:
        with ctx.autocast():
            loss: torch.Tensor = model(x).float().pow(2).mean()
        opt.backward(loss)
        return loss

    return closure


def _snapshot(state: State) -> dict[str, Any]:
    return {
        "params": [p.detach().clone() for p in state.model.parameters()],
        "grads": [None if p.grad is None else p.grad.clone() for p in state.model.parameters()],
        "flags": [p.requires_grad for p in state.model.parameters()],
        "outcomes": [opt.last_outcome for opt in state.opts],
        "optimizers": [copy.deepcopy(opt.state_dict()) for opt in state.opts],
        "context": state.ctx.state_dict(),
        "scale": None if state.ctx.scaler is None else state.ctx.scaler.get_scale(),
    }


def _assert_same(before: dict[str, Any], after: dict[str, Any], what: str) -> None:
    for key in before:
        assert _equal(before[key], after[key]), f"{what} changed {key}"


def _equal(a: object, b: object) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _plain_window_step(precision: Precision) -> list[torch.Tensor]:
    """The parameters after both windows of 2 micro-steps close (a plain loop: the window's mean, one scaler update).

    Under 16-mixed each loss is the recipe's ``scaler.scale(loss / 3)`` (``accumulate_grad_batches=3``), and the
    window of 2, cut short, applies its sum times 3 / 2 (AMP-007).
    """
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))
    opts = [torch.optim.SGD(model[0].parameters(), lr=0.1), torch.optim.SGD(model[1].parameters(), lr=0.1)]
    x = torch.randn(8, 4)
    scaler = GradScaler("cpu") if precision == "16-mixed" else None
    dtype = torch.float16 if precision == "16-mixed" else None
    for micro_step in range(2):  # the order of the context's calls: each batch steps both optimizers
        for index, opt in enumerate(opts):
            others = [p for j, o in enumerate(opts) if j != index for g in o.param_groups for p in g["params"]]
            for p in others:
                p.requires_grad_(False)
            with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                loss = model(x).float().pow(2).mean()
            recipe_backward(loss, scaler, 3)
            for p in others:
                p.requires_grad_(True)
            if micro_step == 1:
                own = [p for g in opt.param_groups for p in g["params"]]
                recipe_window_mean(own, 2, scaler, 3)
                if scaler is not None:
                    scaler.unscale_(opt)
                torch.nn.utils.clip_grad_norm_(own, 10.0)
                if scaler is None:
                    opt.step()
                else:
                    scaler.step(opt)
                opt.zero_grad()
    if scaler is not None:
        scaler.update()
    return [p.detach() for p in model.parameters()]


def _continue(state: State) -> None:
    """The second micro-step of both windows, closing them (``make_optimizer_step=True``)."""
    with state.ctx.batch(1):
        for opt in state.opts:
            opt.step(_closure(state.ctx, state.model, opt, state.x), make_optimizer_step=True)


def _reenter(state: State) -> None:
    def closure() -> torch.Tensor:
        state.opts[1].step(_closure(state.ctx, state.model, state.opts[1], state.x))
        return torch.zeros(())

    with state.ctx.batch(1):
        state.opts[0].step(closure)


def _fail_inner_step(state: State) -> None:
    inner = state.opts[0].optimizer
    assert isinstance(inner, FailingSGD)
    inner.fail = True
    try:
        with state.ctx.batch(1):
            state.opts[0].step(_closure(state.ctx, state.model, state.opts[0], state.x), make_optimizer_step=True)
    finally:
        inner.fail = False


def _raise_after_backward(state: State) -> None:
    def closure() -> torch.Tensor:
        _closure(state.ctx, state.model, state.opts[0], state.x)()
        raise KeyError("after the backward")

    with state.ctx.batch(1):
        state.opts[0].step(closure)


def _backward_after_unscale(state: State) -> None:
    def closure() -> torch.Tensor:
        loss: torch.Tensor = _closure(state.ctx, state.model, state.opts[0], state.x)()
        state.opts[0].unscale_gradients()
        state.opts[0].backward(loss * 0)
        return loss

    with state.ctx.batch(1):
        state.opts[0].step(closure, make_optimizer_step=True)


def _malformed_scaler_entry(state: State) -> None:
    saved = state.ctx.state_dict()
    scaler = saved["scaler"]
    state.ctx.load_state_dict(
        saved | {"scaler": {"scale": 1.0} if scaler is None else {**scaler, "growth_interval": "2"}}
    )


def _add_untrained_parameter(state: State) -> None:
    """A parameter the context refuses (ERR-007): float16 under 16-mixed, whose GradScaler cannot unscale its
    gradients; one off the device in 32-true, which trains every floating-point dtype."""
    if state.ctx.precision == "16-mixed":
        param = torch.nn.Parameter(torch.ones(2, dtype=torch.float16))
    else:
        param = torch.nn.Parameter(torch.ones(2, device="meta"))
    state.opts[0].add_param_group({"params": [param]})


def _wrap_elsewhere(state: State) -> None:
    TrainingContext(state.ctx.precision).wrap(state.opts[1].optimizer)


CASES: dict[str, tuple[Callable[[State], object], type[BaseException], str]] = {
    "closure not callable": (lambda s: s.opts[0].step(3), TypeError, "closure"),  # type: ignore[call-overload]
    "make_optimizer_step truthy": (lambda s: s.opts[0].step(make_optimizer_step=1), TypeError, "bool"),  # type: ignore[call-overload]
    "unknown step kwarg": (lambda s: s.opts[0].step(lr=0.5), TypeError, "does not take 'lr'"),
    "unknown step kwarg on a real step": (
        lambda s: s.opts[0].step(make_optimizer_step=True, momentum=0.9),
        TypeError,
        "does not take",
    ),
    "inner step raises": (_fail_inner_step, RuntimeError, "on purpose"),
    "closure raises after its backward": (_raise_after_backward, KeyError, "after the backward"),
    "step re-entered from a closure": (_reenter, RuntimeError, "another step"),
    "backward after unscale_gradients": (_backward_after_unscale, RuntimeError, "prepared window"),
    "is_last truthy": (lambda s: s.ctx.batch(2, is_last=1).__enter__(), TypeError, "is_last"),  # type: ignore[arg-type]
    "sync_grad truthy": (lambda s: s.opts[0].toggle_model(sync_grad=0).__enter__(), TypeError, "sync_grad"),  # type: ignore[arg-type]
    "negative batch index": (lambda s: s.ctx.batch(-1).__enter__(), ValueError, "batch_idx"),
    "backward of a non-tensor": (lambda s: s.opts[0].backward(1.0), TypeError, "loss tensor"),  # type: ignore[arg-type]
    "wrapped by a second context": (_wrap_elsewhere, ValueError, "another training context"),
    "wrapped twice": (lambda s: s.ctx.wrap(s.opts[0].optimizer), ValueError, "already wrapped"),
    "wrap of a wrapper": (lambda s: s.ctx.wrap(s.opts[0]), TypeError, "already a wrapper"),
    "context state of another format": (lambda s: s.ctx.load_state_dict({"format": 2}), ValueError, "format"),
    "malformed loss-scaler entry": (_malformed_scaler_entry, ValueError, "scaler"),
    "optimizer entry not a dict": (
        lambda s: s.ctx.load_state_dict(s.ctx.state_dict() | {"optimizers": [[], []]}),
        ValueError,
        "not a dict",
    ),
    "add_param_group of a parameter the context does not train": (_add_untrained_parameter, ValueError, "float16|meta"),
    "optimizer state of another layout": (
        lambda s: s.opts[0].load_state_dict(s.opts[1].state_dict() | {"param_groups": []}),
        ValueError,
        "parameter group",
    ),
}


@pytest.mark.parametrize("precision", ["16-mixed", "32-true"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_bad_input_is_refused_and_changes_nothing(precision: Precision, case: str) -> None:
    call, error, message = CASES[case]
    state = _state(precision)
    before = _snapshot(state)
    with pytest.raises(error, match=message):
        call(state)
    _assert_same(before, _snapshot(state), case)
    _continue(state)
    assert [opt.last_outcome for opt in state.opts] == [StepOutcome.STEPPED] * 2
    for got, want in zip(state.model.parameters(), _plain_window_step(precision), strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6, msg=f"after {case}")


@pytest.mark.parametrize("precision", ["16-mixed", "32-true"])
def test_a_failed_inner_step_without_a_closure_keeps_the_window(precision: Precision) -> None:
    """The backward-then-step form: the window the user's backward left is restored, not averaged or unscaled."""
    state = _state(precision)
    inner = state.opts[0].optimizer
    assert isinstance(inner, FailingSGD)
    with state.ctx.batch(1):
        with state.opts[0].toggle_model():
            _closure(state.ctx, state.model, state.opts[0], state.x)()
        window = [None if p.grad is None else p.grad.clone() for p in state.model.parameters()]
        inner.fail = True
        with pytest.raises(RuntimeError, match="on purpose"):
            state.opts[0].step(make_optimizer_step=True)
        inner.fail = False
        assert _equal(window, [None if p.grad is None else p.grad.clone() for p in state.model.parameters()])
        assert state.opts[0].last_outcome is StepOutcome.ACCUMULATED
        state.opts[0].step(make_optimizer_step=True)
        state.opts[1].step(_closure(state.ctx, state.model, state.opts[1], state.x), make_optimizer_step=True)
    for got, want in zip(state.model.parameters(), _plain_window_step(precision), strict=True):
        torch.testing.assert_close(got.detach(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("value", [math.nan, math.inf, 0.0, -1.0, True])
def test_clip_value_must_be_finite_and_positive(value: float) -> None:
    with pytest.raises(ValueError, match="gradient_clip_val"):
        TrainingContext(gradient_clip_val=value)


def test_a_scaler_that_would_not_scale_is_refused() -> None:
    with pytest.raises(ValueError, match="disabled"):
        TrainingContext("16-mixed", scaler=GradScaler("cpu", enabled=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "CUDA is not available", on a machine without CUDA
        cuda_scaler = GradScaler("cuda")
    # Torch disables a CUDA scaler where there is no CUDA (2.13) or keeps it enabled (2.9): refused either way.
    with pytest.raises(ValueError, match=r"built for device 'cuda'|disabled"):
        TrainingContext("16-mixed", scaler=cuda_scaler)
    with pytest.raises(TypeError, match="GradScaler"):
        TrainingContext("16-mixed", scaler=object())  # type: ignore[arg-type]


def test_copies_and_checkpoints_mid_preparation_are_refused() -> None:
    state = _state("16-mixed")
    state.opts[0].unscale_gradients()
    for what, call in (("state_dict", state.ctx.state_dict), ("copy", lambda: copy.deepcopy(state.ctx))):
        with pytest.raises(RuntimeError, match="unscale_gradients"):
            call()
        assert what


def test_torch_privates_the_reference_reads_are_where_it_expects() -> None:
    """The GradScaler and LR-scheduler fields in ``torch_compat``: a torch release that moves them fails here."""
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = GradScaler("cpu", init_scale=4.0)
    assert torch_compat.scaler_device(scaler) == torch.device("cpu")
    assert torch_compat.recorded_found_inf(scaler) is None
    assert not torch_compat.has_unscaled(scaler, opt)
    scaler.scale(model(torch.ones(1, 2)).sum()).backward()
    scaler.unscale_(opt)
    assert torch_compat.has_unscaled(scaler, opt)
    assert torch_compat.found_inf(scaler, opt) is False
    assert torch_compat.recorded_found_inf(scaler) is False
    torch_compat.forget_optimizer(scaler, opt)
    assert not torch_compat.has_unscaled(scaler, opt)
    torch_compat.plant_found_inf(scaler, True, torch.device("cpu"))
    scaler.update()
    assert scaler.get_scale() == 2.0, "a planted found-inf must back the scale off in GradScaler.update()"
    torch_compat.forget_pending(scaler)
    fresh = GradScaler("cpu")
    fresh.load_state_dict(scaler.state_dict())
    torch_compat.start_scale(fresh, torch.device("cpu"))
    assert fresh.get_scale() == 2.0
    assert not torch_compat.steps_through_inf(opt)
    assert torch_compat.steps_through_inf(torch.optim.Adam(model.parameters(), fused=True))
    scheduler = torch.optim.lr_scheduler.StepLR(opt, 1)
    torch_compat.mark_stepped_for_scheduler(opt)
    assert getattr(opt, "_opt_called", False) is True
    assert scheduler.last_epoch == 0


def test_autograd_version_counter_moves_on_every_write_a_backward_makes() -> None:
    """``torch_compat.version_counter``: the failure policy's tell that a backward wrote into a window (FAIL-002)."""
    param = torch.nn.Parameter(torch.ones(3))
    (param * 2).sum().backward()
    assert param.grad is not None
    grad, before = param.grad, torch_compat.version_counter(param.grad)
    (param * 3).sum().backward()  # accumulates in place into the same tensor
    assert param.grad is grad and torch_compat.version_counter(param.grad) > before
    with torch.no_grad():
        before = torch_compat.version_counter(param.grad)
        param.grad.mul_(0.5)
    assert torch_compat.version_counter(param.grad) > before


@pytest.mark.parametrize("policy", ["discard", "restore"])
def test_a_transaction_that_cannot_begin_leaves_the_call_unstarted(policy: str) -> None:
    """The failure policy's transaction raises as it begins (out of memory copying the window): nothing ran, so the
    window is as it was, no ``step()`` counts as running, and the next call steps as a plain loop does."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    plain = copy.deepcopy(model)
    context = TrainingContext(accumulate_grad_batches=2, on_failure=policy)  # type: ignore[arg-type]
    optimizer = context.wrap(torch.optim.SGD(model.parameters(), lr=0.5))
    x = torch.randn(4, 3)
    real_failure = context.parts.failure

    class CannotBegin:
        name = real_failure.name

        def begin(self, *args: Any, **kwargs: Any) -> Any:
            raise MemoryError("no memory for the transaction")

        def begin_preparation(self, *args: Any, **kwargs: Any) -> Any:
            raise MemoryError("no memory for the transaction")

        def begin_backward(self, *args: Any, **kwargs: Any) -> Any:
            return real_failure.begin_backward(*args, **kwargs)

    def closure() -> torch.Tensor:
        loss: torch.Tensor = model(x).square().mean()
        optimizer.backward(loss)
        return loss

    context.parts.failure = CannotBegin()
    with pytest.raises(MemoryError):
        optimizer.step(closure)
    assert context.windows.call is None and not context.holds_open_window()
    assert all(param.grad is None for param in model.parameters())
    context.parts.failure = real_failure
    optimizer.step(closure)
    optimizer.step(closure)  # the window of 2 closes: one real step, as in a plain loop
    plain_optimizer = torch.optim.SGD(plain.parameters(), lr=0.5)
    (plain(x).square().mean() / 2).backward()
    (plain(x).square().mean() / 2).backward()
    plain_optimizer.step()
    for param, expected in zip(model.parameters(), plain.parameters(), strict=True):
        torch.testing.assert_close(param, expected)
    assert optimizer.last_outcome is StepOutcome.STEPPED


@pytest.mark.parametrize("policy", ["discard", "restore"])
def test_an_unscale_whose_transaction_cannot_begin_leaves_the_window(policy: str) -> None:
    """``unscale_gradients()`` between calls, its transaction raising as it begins (out of memory copying the window),
    with ``zero_grad_after_step=False`` and a window that takes the last step's gradients: nothing was prepared, so
    the gradients are where the last step left them, the window is not prepared, and the call can be made again."""
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    context = TrainingContext(on_failure=policy, zero_grad_after_step=False)  # type: ignore[arg-type]
    optimizer = context.wrap(torch.optim.SGD(model.parameters(), lr=0.5))
    x = torch.randn(4, 3)

    def closure() -> torch.Tensor:
        loss: torch.Tensor = model(x).square().mean()
        optimizer.backward(loss)
        return loss

    optimizer.step(closure)  # a taken step: its gradients stay for the next window to carry
    left = [param.grad for param in model.parameters()]
    real_failure = context.parts.failure

    class CannotBegin:
        name = real_failure.name

        def begin(self, *args: Any, **kwargs: Any) -> Any:
            return real_failure.begin(*args, **kwargs)

        def begin_preparation(self, *args: Any, **kwargs: Any) -> Any:
            raise MemoryError("no memory for the transaction")

        def begin_backward(self, *args: Any, **kwargs: Any) -> Any:
            return real_failure.begin_backward(*args, **kwargs)

    context.parts.failure = CannotBegin()
    with pytest.raises(MemoryError):
        optimizer.unscale_gradients()
    assert all(param.grad is grad for param, grad in zip(model.parameters(), left, strict=True))
    assert not context.windows.prepared(context.windows.all[0])
    context.parts.failure = real_failure
    optimizer.unscale_gradients()  # now it prepares: it takes the left gradients as the window's carried part
    assert context.windows.prepared(context.windows.all[0])
