"""Checks of copies and checkpoints: pickle, deepcopy, the optimizer's state dict, the context's own state."""

from __future__ import annotations

import copy
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import (
    assert_same_grads,
    assert_same_values,
    assert_unchanged,
    grads,
    snapshot,
)
from lightning_optimizer.conformance.checkpointing import (
    EPOCH,
    GROWTH,
    PAIR_SCALES,
    build,
    checkpoints,
    layer_optimizers,
    pair_checkpoints,
    pair_resume,
    pair_uninterrupted,
    params,
    plan_loss,
    resume,
    run_plan,
    step_once,
    uninterrupted,
)
from lightning_optimizer.conformance.harness import (
    assert_same_state,
    make_batches,
    make_model,
    oracle_autocast,
    refuses,
    run_steps,
    scaler_settings,
    tolerance_for,
)
from lightning_optimizer.conformance.plain_loop import params_of
from lightning_optimizer.spec import Cell, GradScalerSettings, StepOutcome, TrainingContext

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
    if cell is None or cell.device != "xla":
        return assert_same_values(got, want, what)
    tol = tolerance_for(cell)
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        assert torch.allclose(a.double(), b.double(), rtol=tol.rtol, atol=tol.atol), f"{what}: parameter {i}"


@pytest.mark.requirement("CKPT-001")
@pytest.mark.features("checkpointing")
@pytest.mark.varies(optimizer=("SGD momentum",), window=("k >= 2 micro-steps", "partial, flushed by the last batch"))
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
@pytest.mark.varies(
    copies=("checkpoint",),
    window=("k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    loss_scale=("backed off",),
)
def test_resume_at_every_micro_step_is_bit_identical(make_context: MakeContext, cell: Cell) -> None:
    """Save after any micro-step, resume in fresh objects: the same parameters bit for bit, the same loss scales."""
    want = uninterrupted(make_context, cell)
    for done, checkpoint in enumerate(checkpoints(make_context, cell)):
        got = resume(make_context, cell, checkpoint, start=done + 1)
        _assert_identical(got.params, want.params, f"resumed after batch {done}", cell)
        _assert_same_scales(got.scales, want.scales[done + 1 :], f"resumed after batch {done}")


@pytest.mark.requirement("CKPT-002")
@pytest.mark.features("checkpointing")
@pytest.mark.varies(
    copies=("fresh process",),
    window=("k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    loss_scale=("backed off",),
)
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
@pytest.mark.varies(faults=("refused load",), wrappers=("1", "2"))
def test_context_state_for_another_layout_is_refused(make_context: MakeContext, cell: Cell) -> None:
    """States saved with two optimizers, or with other parameter shapes, are refused and change nothing."""
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: False)
    held = grads(model.parameters())

    two_optimizers = make_context(accumulate_grad_batches=2)
    two_model = two_optimizers.prepare_module(make_model())
    two_optimizers.wrap(torch.optim.SGD(list(two_model.parameters())[:2], lr=0.1))
    two_optimizers.wrap(torch.optim.SGD(list(two_model.parameters())[2:], lr=0.1))
    other_shapes = make_context(accumulate_grad_batches=2)
    wide_model = other_shapes.prepare_module(make_model(sizes=(4, 6, 2)))
    wide = other_shapes.wrap(torch.optim.SGD(wide_model.parameters(), lr=0.1))
    run_steps(other_shapes, wide_model, wide, make_batches(1), cell, lambda i: False)

    for what, other in (("two optimizers", two_optimizers), ("other parameter shapes", other_shapes)):
        with refuses(
            ValueError,
            f"context.load_state_dict(state) of a context with {what}",
            "CKPT-003: a state for another layout is refused with ValueError before anything changes",
        ):
            context.load_state_dict(other.state_dict())
        assert_same_grads(grads(model.parameters()), held, f"a refused load ({what})")
    wrapper.step(make_optimizer_step=None)
    assert wrapper.last_outcome in REAL_STEP, "the open window was lost by a refused load"


@pytest.mark.requirement("CKPT-003")
@pytest.mark.features("checkpointing")
@pytest.mark.parametrize("open_here", [False, True], ids=["all-closed", "open-here"])
@pytest.mark.varies(faults=("refused load",), window=("1 micro-step", "k >= 2 micro-steps"))
def test_state_of_other_shapes_is_refused_with_its_windows_closed(
    make_context: MakeContext, cell: Cell, open_here: bool
) -> None:
    """A state saved with other parameter shapes is refused even when none of its windows holds a gradient.

    Layout is more than what the open windows' gradients show: the saving context stepped every window it had,
    and the loading one has its own window closed, or open (which must then stay as it was).
    """
    context = make_context(accumulate_grad_batches=2)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    run_steps(context, model, wrapper, make_batches(1), cell, lambda i: not open_here)
    other = make_context(accumulate_grad_batches=2)
    wide_model = other.prepare_module(make_model(sizes=(4, 6, 2)))
    wide = other.wrap(torch.optim.SGD(wide_model.parameters(), lr=0.1))
    run_steps(other, wide_model, wide, make_batches(2), cell)
    assert wide.last_outcome in REAL_STEP, f"the saving context's window did not close: {wide.last_outcome}"
    before = snapshot(model)
    with refuses(
        ValueError,
        "context.load_state_dict(state) of a context with other parameter shapes and every window closed "
        f"(this context's window {'open' if open_here else 'closed'})",
        "CKPT-003: a state for other parameter shapes is refused with ValueError, even when no window holds a gradient",
    ):
        context.load_state_dict(other.state_dict())
    assert_unchanged(model, before, "a refused load")
    wrapper.step(make_optimizer_step=None)
    if open_here:
        assert wrapper.last_outcome in REAL_STEP, "the open window was lost by a refused load"


@pytest.mark.requirement("PICKLE-001")
@pytest.mark.features("pickling")
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
@pytest.mark.varies(copies=("pickle", "deepcopy"), window=("k >= 2 micro-steps", "cut short by True"))
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


# -- copies and checkpoints along more dimensions ---------------------------------------------------------------

_NOT_XLA = ("cpu", "cuda")
"""Where the checks below run: on XLA each new graph compiles (seconds), and torch_xla 2.9 reuses the compiled
loss-scale update of the first ``GradScaler`` of the process for every later one (growth settings included), so
scales worked by hand from the factory's settings hold there only in a fresh process."""

GROWING = GradScalerSettings(init_scale=2.0**10, growth_interval=1)
"""Under 16-mixed: the scale doubles after every iteration in which an optimizer stepped and nothing overflowed."""


def _growing_sgd(make_context: MakeContext, cell: Cell) -> tuple[TrainingContext, torch.nn.Module, Any]:
    context = make_context(accumulate_grad_batches=2, **scaler_settings(cell, GROWING))
    model = context.prepare_module(make_model())
    return context, model, context.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))


_COPY_BATCHES = make_batches(8, seed=6)
_run_plan = partial(run_plan, batches=_COPY_BATCHES, overflow=(0, 0))
""":func:`.run_plan` on :data:`_COPY_BATCHES`; under 16-mixed A's loss of batch 0 is infinite unless told otherwise."""
_ORIGINAL_SCALES = [2.0**9] * 2 + [2.0**10] * 2 + [2.0**9] * 2
"""Under 16-mixed, the factor of the original's backward passes, batches 0..5, worked by hand from ``GROWING``:
the window {0, 1} steps (growth), {2, 3} overflows (back-off), {4, 5} steps; the scale (``2**10``, ``2**11``,
``2**10``) over ``accumulate_grad_batches=2`` [AMP-007]."""


def _copy_of(
    wrapper: Any, how: str, model: torch.nn.Module, cell: Cell
) -> tuple[list[torch.Tensor], list[float], Callable[..., Any]]:
    """A copy of ``wrapper``: its parameters, the loss scales its recorded steps used, and a function that steps it.

    The copy's model is the original's module run on the copy's parameters (``torch.func.functional_call``).
    """
    clone = pickle.loads(pickle.dumps(wrapper)) if how == "pickle" else copy.deepcopy(wrapper)
    copied, scales = params_of(clone), list[float]()
    forward = partial(torch.func.functional_call, model, dict(zip(dict(model.named_parameters()), copied, strict=True)))

    def copy_step(batch_idx: int, make_optimizer_step: bool, *, infinite: bool = False, record: bool = False) -> Any:
        def closure() -> torch.Tensor:
            with oracle_autocast(cell):
                loss = plan_loss(
                    forward, _COPY_BATCHES[batch_idx], cell, infinite=infinite, scales=scales if record else None
                )
            clone.backward(loss)
            return loss

        clone.step(closure, make_optimizer_step=make_optimizer_step)
        return clone.last_outcome

    return copied, scales, copy_step


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("PICKLE-001")
@pytest.mark.features("pickling")
@pytest.mark.varies(
    copies=("pickle", "deepcopy", "copy then overflow or growth"),
    loss_scale=("backed off", "grown", "settings given to the factory"),
    window=("k >= 2 micro-steps",),
    position=("inside batch()", "outside batch()"),
    make_optimizer_step=("True", "False", "None"),
    optimizer=("SGD momentum",),
)
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copy_and_original_overflow_and_grow_apart(make_context: MakeContext, cell: Cell, how: str) -> None:
    """A copy taken mid-window and its original step, overflow and grow apart: neither changes the other."""
    sixteen = cell.precision == "16-mixed"
    context, model, wrapper = _growing_sgd(make_context, cell)
    scales: list[float] = []
    # The original's run: the window {2, 3} closes on an infinite loss (batch 3).
    _run_plan(context, model, [wrapper], dict.fromkeys(range(3), (None,)), cell, overflow=(3, 0), scales=scales)
    taken, taken_state = snapshot(model), copy.deepcopy(context.state_dict())  # the window {0, 1} stepped
    copied, copy_scales, copy_step = _copy_of(wrapper, how, model, cell)
    # A twin copy taken at the same moment, which never sees the original train: the copy must end like it.
    twin_copied, twin_scales, twin_step = _copy_of(wrapper, how, model, cell)

    # The copy accumulates, overflows (16-mixed: its scale backs off), then steps twice (and may grow).
    outcomes = [copy_step(3, False, record=True), copy_step(4, True, infinite=sixteen)]
    outcomes += [copy_step(5, True), copy_step(6, True), copy_step(7, False, record=True)]
    for batch_idx, make_step, infinite, record in (
        *((3, False, False, True), (4, True, sixteen, False), (5, True, False, False)),
        *((6, True, False, False), (7, False, False, True), (0, True, False, True)),
    ):
        twin_step(batch_idx, make_step, infinite=infinite, record=record)
    skipped = StepOutcome.SKIPPED_NON_FINITE if sixteen else StepOutcome.STEPPED
    want = [StepOutcome.ACCUMULATED, skipped, StepOutcome.STEPPED, StepOutcome.STEPPED, StepOutcome.ACCUMULATED]
    assert outcomes == want, f"the {how} copy's calls took {outcomes}, expected {want}"
    what = f"after the {how} copy stepped, overflowed and grew"
    assert_unchanged(model, taken, f"{what}, the original's parameters and open window")
    assert_same_state(context.state_dict(), taken_state, f"{what}, the original's context.state_dict()")

    # The other way round: the original closes its window on an infinite loss, then steps again.
    copy_taken = snapshot(copied)
    _run_plan(context, model, [wrapper], dict.fromkeys(range(3, 6), (None,)), cell, overflow=(3, 0), scales=scales)
    assert_unchanged(copied, copy_taken, f"after the original overflowed and stepped, the {how} copy's parameters")
    copy_step(0, True, record=True)
    if sixteen:
        assert scales == _ORIGINAL_SCALES, (
            f"the original's backward passes were scaled by {scales}; by the settings {GROWING} and its own overflow "
            f"alone they are {_ORIGINAL_SCALES}: its {how} copy's overflow or growth reached it"
        )
        assert copy_scales[0] == _ORIGINAL_SCALES[2], (
            f"the {how} copy's first backward pass was scaled by {copy_scales[0]}, the original's scale when it was "
            f"copied is {_ORIGINAL_SCALES[2]}"
        )
        assert copy_scales == twin_scales, (
            f"the {how} copy's loss scales were {copy_scales}, those of a copy taken at the same moment that never saw "
            f"the original train are {twin_scales}: the original's steps and overflow reached the copy"
        )
    what = f"the {how} copy, next to a copy taken at the same moment that never saw the original train"
    _assert_identical(copied, twin_copied, what)
    without_context, without, without_wrapper = _growing_sgd(make_context, cell)
    _run_plan(without_context, without, [without_wrapper], dict.fromkeys(range(6), (None,)), cell, overflow=(3, 0))
    _assert_identical(params(model), params(without), f"the original, next to a {how} copy, and a run without", cell)


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("PICKLE-001")
@pytest.mark.features("pickling")
@pytest.mark.varies(
    copies=("pickle", "deepcopy"),
    wrappers=("2",),
    window=("1 micro-step", "k >= 2 micro-steps", "open while another optimizer steps"),
    optimizer=("SGD momentum", "Adam"),
    param_groups=("2 with other hyper-parameters",),
)
@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_copy_of_either_of_two_wrappers_continues_it(make_context: MakeContext, cell: Cell, how: str) -> None:
    """Copies of each of two wrappers (windows open) close their own window as the originals do."""
    context = make_context(accumulate_grad_batches=3, **scaler_settings(cell, GradScalerSettings(init_scale=2.0**8)))
    model = context.prepare_module(make_model())
    first_weight, first_bias, last_weight, last_bias = model.parameters()
    groups: list[dict[str, Any]] = [{"params": [first_weight]}, {"params": [first_bias], "lr": 0.05}]
    wrappers: dict[str, Any] = {
        "A": context.wrap(torch.optim.SGD(groups, lr=0.1, momentum=0.9)),
        "B": context.wrap(torch.optim.Adam([last_weight, last_bias], lr=0.01)),
    }
    # A's window {0, 1} and B's {1} stay open; B stepped at 0.
    _run_plan(context, model, list(wrappers.values()), {0: (None, True), 1: (None, False)}, cell, overflow=None)
    copies = {
        name: pickle.loads(pickle.dumps(w)) if how == "pickle" else copy.deepcopy(w) for name, w in wrappers.items()
    }
    for name in ("B", "A"):
        original, clone = wrappers[name], copies[name]
        assert type(clone.optimizer) is type(original.optimizer), f"the {how} copy of {name} wraps another class"
        got_lrs = [group["lr"] for group in clone.param_groups]
        want_lrs = [group["lr"] for group in original.param_groups]
        assert got_lrs == want_lrs, f"the {how} copy of {name} has groups with lr {got_lrs}, {name} {want_lrs}"
        clone.step(make_optimizer_step=True)
        original.step(make_optimizer_step=True)
        assert clone.last_outcome is original.last_outcome is StepOutcome.STEPPED, (
            f"{name} and its {how} copy closed their windows as {original.last_outcome} and {clone.last_outcome}"
        )
        what = f"the {how} copy of {name} closed its open window otherwise than {name}"
        _assert_identical(params_of(clone), params_of(original), what, cell)


_LAYERS_SCALER = GradScalerSettings(init_scale=2.0**8)
"""The loss scaler of the contexts of A (SGD with momentum on the first layer) and B (Adam on the rest) (16-mixed)."""


def _sgd_and_adam(
    make_context: MakeContext, cell: Cell, sizes: tuple[int, ...] = (4, 8, 2), third: bool = False
) -> tuple[TrainingContext, torch.nn.Module, list[Any]]:
    """A context (windows of two) with A and B wrapped (:func:`.layer_optimizers`), and a third SGD if asked."""
    context = make_context(accumulate_grad_batches=2, **scaler_settings(cell, _LAYERS_SCALER))
    model = context.prepare_module(make_model(sizes=sizes))
    wrappers: list[Any] = [context.wrap(inner) for inner in layer_optimizers(model, cell)]
    if third:
        wrappers.append(context.wrap(torch.optim.SGD(context.prepare_module(make_model(seed=2)).parameters())))
    return context, model, wrappers


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("CKPT-003")
@pytest.mark.features("checkpointing")
@pytest.mark.varies(
    faults=("refused load",),
    wrappers=("2", "3"),
    loss_scale=("backed off", "settings given to the factory"),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    optimizer=("SGD momentum", "Adam"),
)
def test_refused_load_after_an_overflow_changes_nothing(make_context: MakeContext, cell: Cell) -> None:
    """After an overflow, with two windows open, states for other layouts are refused and change nothing at all."""
    settings = _LAYERS_SCALER
    sixteen = cell.precision == "16-mixed"

    # A's window {0} overflows (16-mixed: skipped, the scale backs off); then A's {1} and B's {0, 1} stay open.
    closing = {2: (True, True)}
    context, model, wrappers = _sgd_and_adam(make_context, cell)
    _run_plan(context, model, wrappers, _OPENING, cell)
    held, state = grads(model.parameters(), to_cpu=True), copy.deepcopy(context.state_dict())
    inner_states = [copy.deepcopy(w.optimizer.state_dict()) for w in wrappers]

    one = make_context(accumulate_grad_batches=2, **scaler_settings(cell, settings))
    one_model = one.prepare_module(make_model())
    one_wrapper = one.wrap(torch.optim.SGD(one_model.parameters(), lr=0.1))
    _run_plan(one, one_model, [one_wrapper], {0: (False,)}, cell)
    wide, wide_model, wide_wrappers = _sgd_and_adam(make_context, cell, sizes=(4, 8, 5, 2))
    # A's window closed, B's open: its shapes show
    _run_plan(wide, wide_model, wide_wrappers, {0: (True, False)}, cell)
    others = {
        "one optimizer": one,
        "B's parameters of other shapes": wide,
        "a third optimizer": _sgd_and_adam(make_context, cell, third=True)[0],
    }
    for what, other in others.items():
        with refuses(
            ValueError,
            f"context.load_state_dict(state) of a context with {what}, two windows open here",
            "CKPT-003: a state for another layout is refused with ValueError before anything changes",
        ):
            context.load_state_dict(other.state_dict())
        assert_same_grads(grads(model.parameters(), to_cpu=True), held, f"a refused load ({what})")
        assert_same_state(context.state_dict(), state, f"after a refused load ({what}), context.state_dict()")
        for index, wrapper in enumerate(wrappers):
            assert_same_state(wrapper.optimizer.state_dict(), inner_states[index], f"a refused load ({what})")

    scales: list[float] = []
    _run_plan(context, model, wrappers, closing, cell, scales=scales)
    outcomes = [wrapper.last_outcome for wrapper in wrappers]
    assert outcomes == [StepOutcome.STEPPED] * 2, f"after the refused loads, the windows closed as {outcomes}"
    if sixteen:
        backed_off = settings.init_scale * settings.backoff_factor
        assert scales == [backed_off / 2] * 2, (
            f"after the refused loads the backward passes were scaled by {scales}; the scale had backed off to "
            f"{backed_off} after the overflow, and each loss is divided by accumulate_grad_batches=2 (AMP-007)"
        )
    twin_context, twin_model, twin_wrappers = _sgd_and_adam(make_context, cell)
    _run_plan(twin_context, twin_model, twin_wrappers, {**_OPENING, **closing}, cell)
    _assert_identical(params(model), params(twin_model), "after refused loads, against a run without them", cell)


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("CKPT-002")
@pytest.mark.features("checkpointing")
@pytest.mark.varies(
    copies=("checkpoint",),
    wrappers=("2",),
    param_groups=("2 with other hyper-parameters", "added after wrap"),
    loss_scale=("grown", "settings given to the factory"),
    window=(
        "1 micro-step",
        "k >= 2 micro-steps",
        "cut short by True",
        "partial, flushed by the last batch",
        "open while another optimizer steps",
    ),
    make_optimizer_step=("True", "False", "None"),
    optimizer=("SGD momentum", "Adam"),
)
def test_resume_two_wrappers_with_a_growing_scale(make_context: MakeContext, cell: Cell) -> None:
    """Two wrappers, two groups, a group added after wrap, a growing scale: every resume is the uninterrupted run."""
    want = pair_uninterrupted(make_context, cell)
    if cell.precision == "16-mixed":
        assert want.scales == PAIR_SCALES, (
            f"the backward passes were scaled by {want.scales}; the settings {GROWTH} with one update per "
            f"iteration in which an optimizer stepped give {PAIR_SCALES}"
        )
    for done, checkpoint in enumerate(pair_checkpoints(make_context, cell)):
        got = pair_resume(make_context, cell, checkpoint, start=done + 1)
        what = f"two wrappers resumed after batch {done}"
        _assert_identical(got.params, want.params, what, cell)
        _assert_same_scales(got.scales, want.scales[2 * (done + 1) :], what)


_OPENING: dict[int, tuple[bool | None, ...]] = {0: (True, False), 1: (False, False)}
"""A's window {0} overflows (16-mixed: skipped, the scale backs off); then A's {1} and B's {0, 1} stay open."""
_CLOSING: dict[int, tuple[bool | None, ...]] = {2: (True, True), 3: (None, None)}


@pytest.mark.cells(devices=_NOT_XLA)
@pytest.mark.requirement("CKPT-002", "CKPT-003")
@pytest.mark.features("checkpointing")
@pytest.mark.varies(
    faults=("refused load",),
    copies=("checkpoint",),
    wrappers=("2",),
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    loss_scale=("backed off", "settings given to the factory"),
    optimizer=("SGD momentum", "Adam"),
)
def test_state_loaded_before_its_optimizers_are_wrapped_is_refused(make_context: MakeContext, cell: Cell) -> None:
    """A context's state loaded into a fresh context before its optimizers are wrapped: refused, nothing changes.

    Saved with two wrappers and both windows open (under 16-mixed after an overflow, so the scaler's state is not a
    fresh one's), loaded first before any wrap, then with only the first optimizer wrapped: each a state for another
    layout (``ValueError``) that leaves parameters, gradients, the context's state and the wrapped optimizer's state
    as they were. Then the second is wrapped, the load succeeds, and the run continues as the uninterrupted one.
    """
    context, model, wrappers = _sgd_and_adam(make_context, cell)
    opened = _run_plan(context, model, wrappers, _OPENING, cell)
    first = StepOutcome.SKIPPED_NON_FINITE if cell.precision == "16-mixed" else StepOutcome.STEPPED
    acc = StepOutcome.ACCUMULATED
    assert opened == [[first, acc], [acc, acc]], f"check precondition: the saving run's first batches took {opened}"
    saved_state = copy.deepcopy(context.state_dict())
    saved_model = copy.deepcopy(model.state_dict())
    saved_optimizers = [copy.deepcopy(w.optimizer.state_dict()) for w in wrappers]
    _run_plan(context, model, wrappers, _CLOSING, cell)

    fresh = make_context(accumulate_grad_batches=2, **scaler_settings(cell, _LAYERS_SCALER))
    fresh_model = fresh.prepare_module(make_model(seed=1))
    fresh_model.load_state_dict(saved_model)
    fresh_wrappers: list[Any] = []
    for wrapped, inner in enumerate(layer_optimizers(fresh_model, cell)):
        before, state = snapshot(fresh_model), copy.deepcopy(fresh.state_dict())
        inner_states = [copy.deepcopy(w.optimizer.state_dict()) for w in fresh_wrappers]
        what = "before any optimizer is wrapped" if wrapped == 0 else f"with {wrapped} of its 2 optimizers wrapped"
        with refuses(
            ValueError,
            f"fresh_context.load_state_dict(state of a context with 2 wrapped optimizers) {what}",
            "CKPT-002, CKPT-003: a state is loaded after the same optimizers are wrapped, in the same order; before "
            "that it is a state for another layout, refused with ValueError before anything changes",
        ):
            fresh.load_state_dict(saved_state)
        after = f"after the refused load {what}"
        assert_unchanged(fresh_model, before, after)
        assert_same_state(fresh.state_dict(), state, f"{after}, the context's state_dict()")
        for index, wrapper in enumerate(fresh_wrappers):
            assert_same_state(wrapper.optimizer.state_dict(), inner_states[index], f"{after}, optimizer {index}")
        inner.load_state_dict(saved_optimizers[wrapped])
        fresh_wrappers.append(fresh.wrap(inner))

    fresh.load_state_dict(saved_state)
    _run_plan(fresh, fresh_model, fresh_wrappers, _CLOSING, cell)
    outcomes = [wrapper.last_outcome for wrapper in fresh_wrappers]
    assert outcomes == [StepOutcome.STEPPED] * 2, f"after the refused loads and the load, the windows took {outcomes}"
    _assert_identical(
        params(fresh_model),
        params(model),
        "loaded once both optimizers were wrapped, against the uninterrupted run",
        cell,
    )
