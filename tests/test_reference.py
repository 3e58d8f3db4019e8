"""Unit tests of the reference beyond the conformance suite: its own errors and edge cases."""

from __future__ import annotations

import importlib.util
import pickle

import pytest
import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.spec import Precision, StepOutcome

HAS_XLA = importlib.util.find_spec("torch_xla") is not None


def _linear(ctx: TrainingContext) -> torch.nn.Module:
    return ctx.prepare_module(torch.nn.Linear(3, 2))


def test_a_scaler_is_accepted_only_with_16_mixed() -> None:
    scaler = GradScaler("cpu", init_scale=8.0)
    assert TrainingContext(precision="16-mixed", scaler=scaler).scaler is scaler
    assert TrainingContext(precision="16-mixed").scaler is not None
    precisions: tuple[Precision, ...] = ("bf16-mixed", "32-true", "bf16-true")
    for precision in precisions:
        assert TrainingContext(precision=precision).scaler is None
        with pytest.raises(ValueError, match="only with 16-mixed"):
            TrainingContext(precision=precision, scaler=scaler)


def test_clipping_settings_are_validated() -> None:
    with pytest.raises(ValueError, match="gradient_clip_val"):
        TrainingContext(gradient_clip_val=0.0)
    with pytest.raises(ValueError, match="gradient_clip_algorithm"):
        TrainingContext(gradient_clip_val=1.0, gradient_clip_algorithm="l2")  # type: ignore[arg-type]


def test_unknown_precision_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"'fp17'.*64-true, 32-true, 16-mixed, bf16-mixed, bf16-true"):
        TrainingContext(precision="fp17")  # type: ignore[arg-type]


@pytest.mark.skipif(HAS_XLA, reason="unavailable here: torch_xla is installed, so it cannot be missing")
def test_xla_without_torch_xla_names_torch_xla() -> None:
    with pytest.raises(ModuleNotFoundError, match="torch_xla"):
        TrainingContext(device="xla")


@pytest.mark.skipif(not HAS_XLA, reason="unavailable here: torch_xla is not installed")
def test_xla_context_runs_on_the_xla_device() -> None:
    assert TrainingContext(device="xla").device.type == "xla"


@pytest.mark.skipif(torch.cuda.is_available(), reason="unavailable here: a CUDA device is present")
def test_cuda_without_a_gpu_says_so() -> None:
    with pytest.raises(RuntimeError, match="no CUDA device"):
        TrainingContext(device="cuda")


def test_wrap_refuses_parameters_of_another_dtype() -> None:
    ctx = TrainingContext(precision="64-true")
    model = torch.nn.Linear(3, 2)  # float32: prepare_module was not called
    with pytest.raises(ValueError, match=r"float64.*prepare_module"):
        ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))


def test_wrap_refuses_the_same_optimizer_twice_and_non_optimizers() -> None:
    ctx = TrainingContext()
    opt = torch.optim.SGD(_linear(ctx).parameters(), lr=0.1)
    ctx.wrap(opt)
    with pytest.raises(ValueError, match="already wrapped"):
        ctx.wrap(opt)
    with pytest.raises(TypeError, match=r"torch\.optim\.Optimizer"):
        ctx.wrap(object())  # type: ignore[type-var]


def test_lbfgs_needs_a_closure_and_refuses_accumulation() -> None:
    ctx = TrainingContext()
    model = _linear(ctx)
    lbfgs = ctx.wrap(torch.optim.LBFGS(model.parameters()))
    with pytest.raises(TypeError, match="needs a closure"):
        lbfgs.step()
    with pytest.raises(ValueError, match="cannot accumulate"):
        lbfgs.step(lambda: torch.zeros(()), make_optimizer_step=False)
    assert lbfgs.last_outcome is None
    with pytest.raises(ValueError, match="accumulate_grad_batches=1"):
        TrainingContext(accumulate_grad_batches=2).wrap(torch.optim.LBFGS(torch.nn.Linear(3, 2).parameters()))


def test_batches_do_not_nest_and_need_a_valid_index() -> None:
    ctx = TrainingContext()
    with ctx.batch(0), pytest.raises(RuntimeError, match="do not nest"), ctx.batch(1):
        pass
    with pytest.raises(ValueError, match="batch_idx"), ctx.batch(-1):
        pass


def test_backward_refuses_a_non_tensor() -> None:
    ctx = TrainingContext()
    opt = ctx.wrap(torch.optim.SGD(_linear(ctx).parameters(), lr=0.1))
    with pytest.raises(TypeError, match="loss tensor"):
        opt.backward(1.0)  # type: ignore[arg-type]


def test_context_state_validation_names_the_problem() -> None:
    ctx = TrainingContext(accumulate_grad_batches=2)
    model = _linear(ctx)
    opt = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.ones(1, 3)).sum().backward()
    opt.step(make_optimizer_step=False)
    state = ctx.state_dict()
    assert state["optimizers"][0]["pending"] == 1
    with pytest.raises(ValueError, match="format"):
        ctx.load_state_dict({"format": 99})
    with pytest.raises(ValueError, match="precision"):
        ctx.load_state_dict(state | {"precision": "64-true"})
    wrong_shape = [torch.zeros(5), *state["optimizers"][0]["grads"][1:]]
    broken = state | {"optimizers": [state["optimizers"][0] | {"grads": wrong_shape}]}
    with pytest.raises(ValueError, match="parameter 0"):
        ctx.load_state_dict(broken)
    with pytest.raises(ValueError, match="non-negative int"):
        ctx.load_state_dict(state | {"optimizers": [state["optimizers"][0] | {"pending": -1}]})


def test_wrapper_class_is_cached_and_pickles_by_rebuilding() -> None:
    ctx = TrainingContext()
    model = _linear(ctx)
    first = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    second = ctx.wrap(torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1))
    assert type(first) is type(second)
    assert isinstance(first, WrappedOptimizer)
    clone = pickle.loads(pickle.dumps(first))
    assert type(clone).__name__ == "WrappedSGD"
    clone.step(make_optimizer_step=True)
    assert clone.last_outcome is StepOutcome.STEPPED
    assert first.last_outcome is None


def test_scheduler_patch_stays_on_the_wrapper() -> None:
    ctx = TrainingContext()
    opt = ctx.wrap(torch.optim.SGD(_linear(ctx).parameters(), lr=1.0))
    torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    assert "step" in vars(opt), "the scheduler's patched step must live on the wrapper"
    assert "step" not in vars(opt.optimizer), "the patch must not reach the inner optimizer (it would recurse)"
    opt.step(make_optimizer_step=True)
    assert getattr(opt.optimizer, "_opt_called", False), "the scheduler's marker must reach the inner optimizer"


def test_accumulate_grad_batches_changes_only_between_windows() -> None:
    """The schedule of a ``GradientAccumulationScheduler``: settable when no window holds micro-steps."""
    ctx = TrainingContext(accumulate_grad_batches=2)
    model = _linear(ctx)
    opt = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    x = torch.ones(4, 3)

    def closure() -> torch.Tensor:
        loss: torch.Tensor = model(x).sum()
        opt.backward(loss)
        return loss

    ctx.accumulate_grad_batches = 3
    assert ctx.accumulate_grad_batches == 3
    with pytest.raises(TypeError, match="positive int"):
        ctx.accumulate_grad_batches = 2.0  # type: ignore[assignment]
    with pytest.raises(ValueError, match="positive int"):
        ctx.accumulate_grad_batches = 0
    assert not ctx.holds_open_window()
    opt.step(closure)
    assert opt.last_outcome is StepOutcome.ACCUMULATED
    assert ctx.holds_open_window()
    with pytest.raises(RuntimeError, match="while a window holds accumulated micro-steps"):
        ctx.accumulate_grad_batches = 4
    assert ctx.accumulate_grad_batches == 3
    opt.step(closure, make_optimizer_step=True)
    assert not ctx.holds_open_window()
    ctx.accumulate_grad_batches = 1
    assert ctx.accumulate_grad_batches == 1


def test_an_optimizer_that_evaluates_its_closure_keeps_accumulate_grad_batches_at_1() -> None:
    ctx = TrainingContext()
    ctx.wrap(torch.optim.LBFGS(_linear(ctx).parameters()))
    with pytest.raises(ValueError, match="evaluates its closure"):
        ctx.accumulate_grad_batches = 2
    assert ctx.accumulate_grad_batches == 1
