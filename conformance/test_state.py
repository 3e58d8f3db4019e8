"""Checks of copies and checkpoints: pickle, deepcopy, the optimizer's state dict, the context's own state."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.checkpointing import (
    EPOCH,
    build,
    checkpoints,
    params,
    resume,
    step_once,
    uninterrupted,
)
from lightning_optimizer.conformance.harness import make_batches, make_model, run_steps, tolerance_for
from lightning_optimizer.spec import Cell, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]
REAL_STEP = (StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE)
MID_WINDOW = 3
"""Batches 0..3 done: the window {3, 4} is open."""


def _assert_same_scales(got: list[float], want: list[float], what: str) -> None:
    """Under 16-mixed, each resumed backward pass used the loss scale that the uninterrupted run used there."""
    assert got == want, (
        f"{what}: the backward passes were scaled by {got}, the uninterrupted run's by {want}; the context's state "
        "must carry the loss scaler's state"
    )


def _assert_identical(got: list[torch.Tensor], want: list[torch.Tensor], what: str, cell: Cell | None = None) -> None:
    """Bit for bit; on XLA, which compiles a resumed run into other graphs, to the cell's tolerance."""
    if cell is not None and cell.device == "xla":
        tol = tolerance_for(cell)
        for i, (a, b) in enumerate(zip(got, want, strict=True)):
            assert torch.allclose(a.double(), b.double(), rtol=tol.rtol, atol=tol.atol), f"{what}: parameter {i}"
        return
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(a, b), f"{what}: parameter {i} differs by {(a.double() - b.double()).abs().max().item():.3g}"


@pytest.mark.requirement("CKPT-001")
@pytest.mark.features("checkpointing")
def test_state_dict_is_the_inner_format(make_context: MakeContext, cell: Cell) -> None:
    """``state_dict()`` equals the inner optimizer's, with its keys and per-parameter state."""
    context, model, wrapper = build(make_context)
    outcomes = run_steps(context, model, wrapper, make_batches(9), cell)
    assert StepOutcome.STEPPED in outcomes, f"no window stepped: {outcomes}"
    got, want = wrapper.state_dict(), wrapper.optimizer.state_dict()
    assert set(got) == {"state", "param_groups"}, f"state_dict keys are {sorted(got)}"
    assert got["param_groups"] == want["param_groups"]
    assert set(got["state"]) == set(want["state"]) == set(range(len(list(model.parameters()))))
    for index, entry in want["state"].items():
        torch.testing.assert_close(got["state"][index]["momentum_buffer"], entry["momentum_buffer"])


@pytest.mark.requirement("CKPT-002")
@pytest.mark.features("checkpointing")
def test_resume_at_every_micro_step_is_bit_identical(make_context: MakeContext, cell: Cell) -> None:
    """Save after any micro-step, resume in fresh objects: the same parameters bit for bit, the same loss scales."""
    want = uninterrupted(make_context, cell)
    for done, checkpoint in enumerate(checkpoints(make_context, cell)):
        got = resume(make_context, cell, checkpoint, start=done + 1)
        _assert_identical(got.params, want.params, f"resumed after batch {done}", cell)
        _assert_same_scales(got.scales, want.scales[done + 1 :], f"resumed after batch {done}")


@pytest.mark.requirement("CKPT-002")
@pytest.mark.features("checkpointing")
def test_resume_in_a_fresh_process(make_context: MakeContext, cell: Cell, tmp_path: Path, pytestconfig: Any) -> None:
    """Checkpoints saved after every micro-step, each resumed by one new Python process: identical trajectories.

    Bit for bit on CPU and CUDA (64-true and 32-true included), and under 16-mixed with the loss scaler's state:
    the scenario overflows in its first window, and each resumed backward pass must use the scale that the
    uninterrupted run used there. On XLA, which compiles every resumed run into new graphs (seconds each) and
    matches only to rounding, the process resumes the mid-window checkpoint alone; the in-process check resumes
    every one there.
    """
    want = uninterrupted(make_context, cell)
    resumes = []
    saved = checkpoints(make_context, cell)
    for done in range(EPOCH) if cell.device != "xla" else [MID_WINDOW]:
        path = tmp_path / f"checkpoint-{done}.pt"
        path.write_bytes(saved[done])
        resumes.append(f"{done + 1}={path}")
    result = tmp_path / "trajectories.pt"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    command = [sys.executable, "-m", "lightning_optimizer.conformance.resume_worker", pytestconfig.getoption("impl")]
    command += [cell.device, cell.precision, str(result), *resumes]
    completed = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert completed.returncode == 0, f"the resuming process failed:\n{completed.stderr[-3000:]}"
    trajectories = torch.load(result, weights_only=True)
    starts = [int(item.partition("=")[0]) for item in resumes]
    assert [t["start"] for t in trajectories] == starts, "the worker did not resume every checkpoint"
    for trajectory in trajectories:
        what = f"resumed after batch {trajectory['start'] - 1} in a fresh process"
        _assert_identical(trajectory["params"], want.params, what, cell)
        _assert_same_scales(trajectory["scales"], want.scales[trajectory["start"] :], what)


@pytest.mark.requirement("CKPT-003")
@pytest.mark.features("checkpointing")
def test_context_state_for_another_layout_is_refused(make_context: MakeContext, cell: Cell) -> None:
    """States saved with two optimizers, or with other parameter shapes, are refused and change nothing."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: False)
    grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]

    two_optimizers = make_context(accumulate_grad_batches=2)
    two_model = two_optimizers.prepare_module(make_model())
    two_optimizers.wrap(torch.optim.SGD(list(two_model.parameters())[:2], lr=0.1))
    two_optimizers.wrap(torch.optim.SGD(list(two_model.parameters())[2:], lr=0.1))
    other_shapes = make_context(accumulate_grad_batches=2)
    wide_model = other_shapes.prepare_module(make_model(sizes=(4, 6, 2)))
    wide = other_shapes.wrap(torch.optim.SGD(wide_model.parameters(), lr=0.1))
    run_steps(other_shapes, wide_model, wide, make_batches(1), cell, lambda i: False)

    for what, other in (("two optimizers", two_optimizers), ("other parameter shapes", other_shapes)):
        with pytest.raises(ValueError):
            context.load_state_dict(other.state_dict())
        for param, grad in zip(model.parameters(), grads, strict=True):
            assert grad is not None and param.grad is not None, f"a refused load ({what}) cleared a gradient"
            assert torch.equal(param.grad, grad), f"a refused load ({what}) changed a gradient"
    wrapper.step(make_optimizer_step=None)
    assert wrapper.last_outcome in REAL_STEP, "the open window was lost by a refused load"


@pytest.mark.requirement("PICKLE-001")
@pytest.mark.features("pickling")
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copies_continue_independently(make_context: MakeContext, cell: Cell, how: str) -> None:
    """A copy taken with a window open continues the same trajectory; the original is unaffected."""
    context, model, wrapper = build(make_context)
    for batch_idx in range(4):  # window {0, 1, 2} steps, then {3, 4} is open
        step_once(context, model, wrapper, batch_idx, cell)
    clone = pickle.loads(pickle.dumps(wrapper)) if how == "pickle" else copy.deepcopy(wrapper)
    assert isinstance(clone, type(wrapper.optimizer)), f"the {how} copy is a {type(clone).__name__}"
    assert clone.optimizer is not wrapper.optimizer, f"the {how} copy shares the inner optimizer"
    before = params(model)
    clone.step(make_optimizer_step=True)
    assert clone.last_outcome in REAL_STEP
    _assert_identical(params(model), before, f"stepping the {how} copy changed the original's parameters")
    wrapper.step(make_optimizer_step=True)
    copied = [p.detach().cpu() for group in clone.param_groups for p in group["params"]]
    _assert_identical(
        copied, params(model), f"the {how} copy and the original closed the same window differently", cell
    )
    assert wrapper.last_outcome is clone.last_outcome, "the copy and the original took different outcomes"
    if clone.last_outcome is StepOutcome.STEPPED:
        assert not all(torch.equal(a, b) for a, b in zip(copied, before, strict=True)), "nothing stepped"
