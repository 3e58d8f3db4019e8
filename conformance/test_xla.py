"""Checks of XLA cells: one gradient reduction per window, after its last backward, then one graph cut.

The checks observe behaviour, not which torch_xla function an implementation calls. torch_xla is shown a world of
two replicas (``torch_xla.runtime.world_size()`` and ``global_runtime_device_count()`` answer 2, patched before the
context is built; an implementation must ask the runtime when it reduces, not keep an answer from import time) on
its one real device. A reduction across replicas then really runs on that device, an XLA all-reduce summing over the
one real replica: with the usual ``1 / world_size`` scale it halves the gradients, as if a second replica had
contributed zero gradients. Whatever API an implementation reduces with (``xm.reduce_gradients``, ``xm.all_reduce``
of a list or of each tensor, bucketed or not), each real step must therefore apply half the window's mean gradient,
which a plain-PyTorch oracle computes. When reductions and graph cuts happen is read from torch_xla's own metrics
(``torch_xla.debug.metrics``): its all-reduce counters and ``MarkStep`` (every ``torch_xla.sync()``,
``xm.mark_step()``, ``xm.optimizer_step(barrier=True)``), sampled around each call into the implementation and at
each backward (a gradient hook). Whether the cut came after the inner step is read from the parameters: after a real
step, reading them must run no computation (their update was executed by the cut).

With clipping configured the clip must see, and keep, the reduced gradients. A pitfall there: after torch_xla's
in-place all-reduce of gradients that were changed in place (accumulated over micro-steps, divided by the window's
length), a fresh ``grad.detach()`` alias still reads the values from before the reduction, and torch_xla's own
``clip_grad_norm_`` multiplies the gradients in place through such aliases: it writes the unreduced gradients back.
Rebinding each gradient to a fresh tensor after the reduction (``p.grad = p.grad.clone()``), or reducing out of
place, avoids it.

XLA's CPU backend cannot all-reduce bfloat16 (``AllReduce for datatype 'bf16' is not supported``). There, in
bf16-true, torch_xla is shown its one real replica: reductions are then no-ops that leave no trace, and the checks
see the graph cuts and the parameters only.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pytest
import torch

from lightning_optimizer.conformance.assertions import param_values
from lightning_optimizer.conformance.harness import (
    Batch,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    oracle_step_done,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.plain_loop import (
    oracle_loss,
    plain_scaler,
    real_step,
    scaled_backward,
    update_scaler,
)
from lightning_optimizer.spec import (
    Cell,
    GradScalerSettings,
    ImplementationInfo,
    OptimizerWrapper,
    StepOutcome,
    TrainingContext,
)

MakeContext = Callable[..., TrainingContext]
CallForm = Literal["closure", "backward, then step()"]

PRESENTED_WORLD_SIZE = 2
"""The number of replicas torch_xla is told about; the second one contributes nothing to a reduction."""
LR = 0.5
"""Large enough that a window applied unreduced (twice the expected gradient) moves parameters far off."""
CLIP_NORM = 0.7
"""Between the 2-norm of the first window's reduced mean gradient (0.48) and twice that: the reduced gradient is not
clipped, the unreduced one would be, and one clipped before its reduction comes out at half the threshold. The
second window's reduced gradient is longer (2.6) and clipped: one clipped before its reduction is half as long."""
SCALER = GradScalerSettings(init_scale=2.0**8)
"""16-mixed: an initial scale at which this model's fp16 gradients stay finite, so that no step is skipped."""


@dataclass(frozen=True)
class _Counts:
    """torch_xla's counts so far: cross-replica reductions, graph cuts, executed computations."""

    reductions: int
    cuts: int
    executions: int


def _is_reduction(counter: str) -> bool:
    """Whether a torch_xla counter counts all-reduces (``xla::AllReduceInPlace``, ``xla::AllReduce``, c10d's)."""
    return counter.lower().replace("_", "").removeprefix("xla::").startswith("allreduce")


def _counts() -> _Counts:
    import torch_xla.debug.metrics

    met: Any = torch_xla.debug.metrics  # torch_xla leaves these functions unannotated

    def value(name: str) -> int:
        return int(met.counter_value(name) or 0)

    names = met.counter_names()
    return _Counts(
        reductions=sum(value(name) for name in names if _is_reduction(name)),
        cuts=value("MarkStep"),
        executions=value("ExecuteComputation"),
    )


def _settled_executions() -> int:
    """Computations executed so far, once every launched one has run (a graph cut launches asynchronously)."""
    import torch_xla.core.xla_model as xm

    xm.wait_device_ops()
    return _counts().executions


def _present_replicas(monkeypatch: pytest.MonkeyPatch, cell: Cell) -> int:
    """Show torch_xla a world of two replicas, where its backend can reduce the cell's gradients; the size shown."""
    import torch_xla.runtime as xr

    if cell.precision == "bf16-true" and xr.device_type() == "CPU":
        return 1  # the CPU backend refuses (or crashes on) a bfloat16 all-reduce
    for query in ("world_size", "global_runtime_device_count"):  # the runtime's two answers to "how many replicas"
        monkeypatch.setattr(xr, query, lambda: PRESENTED_WORLD_SIZE)
    return PRESENTED_WORLD_SIZE


@dataclass
class _Iteration:
    """What was observed in one iteration of the loop (one ``context.batch`` block)."""

    batch_idx: int
    form: CallForm
    start: _Counts
    step_start: _Counts
    step_end: _Counts
    end: _Counts
    backwards: list[_Counts]
    """The counts at each backward pass of the iteration (a gradient hook on the first parameter)."""
    read_executions: int
    """Computations that reading the parameters after the iteration ran (none once the graph was cut)."""
    params: list[torch.Tensor] | None
    """The parameters after the iteration, from the first real step on."""


@dataclass(frozen=True)
class _Epoch:
    """One epoch of a check: the context's window length, the loop, and the windows worked out by hand."""

    accumulate_grad_batches: int
    batch_count: int
    make_optimizer_step: Mapping[int, bool]
    """``make_optimizer_step`` per batch index (``None`` where absent)."""
    windows: tuple[tuple[int, ...], ...]
    """The windows the spec's schedule gives for that loop (STEP-001..003), in order."""
    backward_then_step: frozenset[int] = frozenset()
    """Batches whose backward runs in a ``toggle_model()`` block before a bare ``step()``; the others use a closure."""

    def form(self, batch_idx: int) -> CallForm:
        """The call form of a batch."""
        return "backward, then step()" if batch_idx in self.backward_then_step else "closure"


def _run_epoch(
    context: TrainingContext, model: torch.nn.Module, wrapper: OptimizerWrapper[Any], epoch: _Epoch, cell: Cell
) -> list[_Iteration]:
    """Drive one epoch of the implementation, counting reductions and graph cuts around each of its calls."""
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(epoch.batch_count)
    backwards: list[_Counts] = []

    def observe_backward(grad: torch.Tensor) -> None:
        backwards.append(_counts())

    def loss_of(batch: Batch) -> torch.Tensor:
        with context.autocast():
            return mse(model, batch, device, dtype)

    handle = next(model.parameters()).register_hook(observe_backward)
    iterations = []
    try:
        for batch_idx, batch in enumerate(batches):
            make_optimizer_step, form = epoch.make_optimizer_step.get(batch_idx), epoch.form(batch_idx)
            del backwards[:]
            start = _counts()
            with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
                if form == "closure":

                    def closure(batch: Batch = batch) -> torch.Tensor:
                        loss = loss_of(batch)
                        wrapper.backward(loss)
                        return loss

                    step_start = _counts()
                    wrapper.step(closure, make_optimizer_step=make_optimizer_step)
                else:
                    with wrapper.toggle_model():
                        wrapper.backward(loss_of(batch))
                    step_start = _counts()
                    wrapper.step(make_optimizer_step=make_optimizer_step)
                step_end = _counts()
            end = _counts()
            params, read = None, 0
            if batch_idx >= epoch.windows[0][-1]:
                # Before the first real step the parameters may still be pending casts of prepare_module.
                settled = _settled_executions()
                params = [param.detach().cpu().clone() for param in model.parameters()]
                read = _counts().executions - settled
            iterations.append(
                _Iteration(batch_idx, form, start, step_start, step_end, end, list(backwards), read, params)
            )
    finally:
        handle.remove()
    return iterations


def _check_reductions_and_cuts(iterations: Sequence[_Iteration], epoch: _Epoch, cell: Cell, world: int) -> None:
    """Per iteration: reductions only in the closing step() after the window's last backward; one cut per window.

    With one replica shown (``world`` 1) reductions leave no trace: only the graph cuts are checked.
    """
    reduces = world > 1
    window_of = {batch_idx: window for window in epoch.windows for batch_idx in window}
    for it in iterations:
        window = window_of[it.batch_idx]
        where = f"{cell.id}, batch {it.batch_idx} ({it.form} form) of window {list(window)}"
        assert len(it.backwards) == 1, f"{where}: expected the batch's one backward pass, saw {len(it.backwards)}"
        backward = it.backwards[0]
        if it.batch_idx != window[-1]:
            reductions, cuts = it.end.reductions - it.start.reductions, it.end.cuts - it.start.cuts
            assert not reduces or reductions == 0, (
                f"{where}: this micro-step accumulates (the window is still open), yet {reductions} cross-replica "
                "reduction(s) ran in its iteration; a window is reduced once, on its real step, after its last "
                "backward"
            )
            assert cuts == 0, (
                f"{where}: this micro-step accumulates, yet the lazy graph was cut {cuts} time(s) in its iteration "
                "(torch_xla.sync / xm.mark_step); a window costs one graph cut, after its real step"
            )
            continue
        if reduces:
            before = backward.reductions - it.start.reductions
            assert before == 0, (
                f"{where}: this batch closes the window, but {before} cross-replica reduction(s) ran before the "
                "window's last backward (this batch's): its gradients would miss the reduction"
            )
            # In the closure form step() starts first and its closure runs the backward; otherwise backward first.
            closure_form = it.form == "closure"
            in_step = it.step_end.reductions - (backward if closure_form else it.step_start).reductions
            assert in_step > 0, (
                f"{where}: this batch's step() takes the window's real step, but no cross-replica reduction of the "
                f"gradients ran in it after the window's last backward (torch_xla was shown {world} replicas)"
            )
            outside = it.end.reductions - it.step_end.reductions
            if not closure_form:
                outside += it.step_start.reductions - backward.reductions
            assert outside == 0, (
                f"{where}: {outside} cross-replica reduction(s) ran outside the step() that closes the window; the "
                "window is reduced in its real step, before the inner optimizer steps"
            )
        cuts = it.end.cuts - it.start.cuts
        assert cuts == 1, (
            f"{where}: expected exactly one graph cut (torch_xla.sync / xm.mark_step) in the iteration of a real "
            f"step, saw {cuts}"
        )
        assert it.read_executions == 0, (
            f"{where}: after the real step, reading the parameters ran {it.read_executions} XLA computation(s): "
            "their update was still pending, so the graph was not cut after the inner optimizer step"
        )


Groups = Callable[[torch.nn.Module], list[dict[str, Any]]]


Reduction = Literal["before clipping", "after clipping", "none"]
"""Where an oracle reduces each window's gradients: the rule (before clipping), or a wrong place, to diagnose."""


def _oracle(
    epoch: _Epoch,
    cell: Cell,
    groups: Groups,
    clip_norm: float | None,
    world: int,
    reduction: Reduction = "before clipping",
) -> list[list[torch.Tensor]]:
    """Plain PyTorch on the XLA device: the parameters first, then after each window's step.

    Each window's gradient is the mean of its micro-batch gradients (16-mixed: each loss scaled as the recipe's
    ``scaler.scale(loss / N)``), reduced over the ``world`` shown (a sum over the one real replica, scaled by
    ``1 / world``): so the window's mean divided by ``world``, then (16-mixed) unscaled, (when asked) clipped by
    norm, stepped, and the graph cut. ``reduction`` moves the division by ``world`` after the clipping, or drops
    it: the oracles of two wrong implementations, for the error message.
    """
    batches = make_batches(epoch.batch_count)
    model = oracle_copy(make_model(), cell)
    optimizer = torch.optim.SGD(groups(model))
    scaler = plain_scaler(cell, SCALER)
    snapshots = [param_values(model.parameters(), to_cpu=True)]
    n = epoch.accumulate_grad_batches

    def divide(params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for param in params:
                if param.grad is not None:
                    param.grad /= world

    def clip(params: list[torch.Tensor]) -> None:
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        if reduction == "after clipping":
            divide(params)

    for window in epoch.windows:
        for batch_idx in window:
            scaled_backward(oracle_loss(model, batches[batch_idx], cell, factor=1.0), scaler, n)
        real_step(
            optimizer, len(window), scaler, n, reduce=divide if reduction == "before clipping" else None, clip=clip
        )
        assert update_scaler(scaler) == 1.0, "the check's own oracle overflowed: its inputs need another scale"
        oracle_step_done(cell)
        snapshots.append(param_values(model.parameters(), to_cpu=True))
    return snapshots


def _close(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], cell: Cell) -> bool:
    tol = tolerance_for(cell)
    return all(
        torch.allclose(g.double(), w.double(), rtol=tol.rtol, atol=tol.atol) for g, w in zip(got, want, strict=True)
    )


def _check_values(
    iterations: Sequence[_Iteration],
    epoch: _Epoch,
    names: Sequence[str],
    cell: Cell,
    groups: Groups,
    clip_norm: float | None,
    world: int,
) -> None:
    """After every iteration, the parameters equal the oracle's after the windows closed so far."""
    expected = _oracle(epoch, cell, groups, clip_norm, world)
    reduced = (
        f"reduced over the {world} replicas torch_xla was shown (the second contributing zero gradients: half the mean)"
        if world > 1
        else "(one replica: nothing to reduce)"
    )
    closers = [window[-1] for window in epoch.windows]
    tol = tolerance_for(cell)
    for it in iterations:
        if it.params is None:
            continue
        closed = sum(1 for last in closers if last <= it.batch_idx)
        for name, got, want in zip(names, it.params, expected[closed], strict=True):
            got64, want64 = got.double(), want.double()
            if torch.allclose(got64, want64, rtol=tol.rtol, atol=tol.atol):
                continue
            diff = (got64 - want64).abs().max().item()
            hint = ""
            if world > 1:
                wrong: list[tuple[Reduction, str]] = [
                    (
                        "none",
                        "applied unreduced (never reduced, summed without the 1 / world_size scale, or reduced "
                        "then overwritten)",
                    )
                ]
                if clip_norm is not None:
                    wrong.append(("after clipping", "clipped before they were reduced"))
                for reduction, meaning in wrong:
                    if _close(it.params, _oracle(epoch, cell, groups, clip_norm, world, reduction)[closed], cell):
                        hint = f"; they match an oracle whose window gradients were {meaning}"
            raise AssertionError(
                f"{cell.id}: after batch {it.batch_idx} ({closed} of the windows "
                f"{[list(w) for w in epoch.windows]} stepped) parameter {name!r} differs from the plain-PyTorch "
                f"oracle, whose every real step applies the window's mean gradient {reduced}, then clipped when "
                f"clipping is configured (max abs diff {diff:.3g}, rtol {tol.rtol}, atol {tol.atol}){hint}"
            )


def _one_group(model: torch.nn.Module) -> list[dict[str, Any]]:
    return [{"params": list(model.parameters()), "lr": LR}]


def _two_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    assert isinstance(model, torch.nn.Sequential)
    return [{"params": list(model[0].parameters()), "lr": LR}, {"params": list(model[2].parameters()), "lr": LR / 4}]


def _check_epoch(
    make_context: MakeContext,
    cell: Cell,
    monkeypatch: pytest.MonkeyPatch,
    epoch: _Epoch,
    groups: Groups,
    clip_norm: float | None = None,
) -> None:
    """Run ``epoch`` on the implementation in a world of two replicas; check reductions, cuts and parameters."""
    world = _present_replicas(monkeypatch, cell)
    options: dict[str, Any] = {"accumulate_grad_batches": epoch.accumulate_grad_batches}
    if clip_norm is not None:
        options["gradient_clip_val"] = clip_norm
    if cell.precision == "16-mixed":
        options["grad_scaler"] = SCALER
    context = make_context(**options)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(groups(model)))
    iterations = _run_epoch(context, model, wrapper, epoch, cell)
    _check_reductions_and_cuts(iterations, epoch, cell, world)
    names = [name for name, _ in model.named_parameters()]
    _check_values(iterations, epoch, names, cell, groups, clip_norm, world)


WINDOWS = _Epoch(
    accumulate_grad_batches=3,
    batch_count=7,
    make_optimizer_step={4: True, 5: False},
    windows=((0, 1, 2), (3, 4), (5, 6)),
    backward_then_step=frozenset({3, 4, 5}),
)
"""A full window of 3 (closures), one cut short by True (backward, then step()), and a partial one (batch 5 held
open by False, in the backward-then-step form; batch 6 a closure) flushed by the epoch's last batch."""

CLIPPED = _Epoch(accumulate_grad_batches=3, batch_count=5, make_optimizer_step={1: False}, windows=((0, 1, 2), (3, 4)))
"""A full window of 3 (batch 1 explicitly False), then a partial one flushed by the last batch. No window of one
micro-step: a reduction misplaced before its closure would find no gradient at all, and torch_xla's all-reduce of
an empty list crashes the process instead of failing the check."""


@pytest.mark.requirement("XLA-001")
@pytest.mark.cells(devices=("xla",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward", "toggle_model block, then step()"),
    position=("inside batch()",),
    reduction=("result", "count per window", "graph cuts per window"),
)
def test_one_reduction_per_window_after_its_last_backward(
    make_context: MakeContext, cell: Cell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each window (3; 2 cut short by True; 2 flushed by the last batch) is reduced once, then the graph cut once.

    Closures and backward-then-step() micro-steps; the reduction runs in the window's real step, after its last
    backward; the parameters follow the reduced window means.
    """
    _check_epoch(make_context, cell, monkeypatch, WINDOWS, _one_group)


@pytest.mark.requirement("XLA-001", "CLIP-001")
@pytest.mark.cells(devices=("xla",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "partial, flushed by the last batch"),
    make_optimizer_step=("False", "None"),
    call_form=("closure, wrapper.backward",),
    param_groups=("2 with other hyper-parameters",),
    clipping=("norm",),
    reduction=("result", "count per window", "graph cuts per window"),
)
def test_one_reduction_per_window_then_clipping(
    make_context: MakeContext, cell: Cell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clipping by norm over two parameter groups sees each window's reduced gradients, and keeps them reduced.

    Each window is reduced once in its real step, then clipped, stepped, and the graph cut once.
    """
    _check_epoch(make_context, cell, monkeypatch, CLIPPED, _two_groups, clip_norm=CLIP_NORM)


SEVERAL = {0: (("a", False), ("b", False)), 1: (("a", True), ("b", False)), 2: (("b", True), ("a", None))}
"""Per batch, each optimizer's call in order (``accumulate_grad_batches=2``, three batches): ``a`` closes a window
of 2 at batch 1 while ``b`` accumulates (under 16-mixed ``a``'s step there is skipped, its loss infinite); ``b``
closes a window of 3 at batch 2, then ``a``'s new window of one micro-step is flushed by the last batch."""
SKIPPED_AT = ("a", 1)


def _several_oracle(cell: Cell, world: int) -> dict[str, list[list[torch.Tensor]]]:
    """Plain PyTorch: two models, one SGD each, one ``GradScaler``; each window's mean divided by ``world``.

    The parameters of each model after every batch. Under 16-mixed ``a``'s step at batch 1 overflows and is
    skipped; the scale backs off at the batch's end and ``b``'s open window is rescaled [AMP-006].
    """
    batches = make_batches(len(SEVERAL))
    models = {"a": oracle_copy(make_model(seed=0), cell), "b": oracle_copy(make_model(seed=1), cell)}
    optimizers = {name: torch.optim.SGD(model.parameters(), lr=LR) for name, model in models.items()}
    scaler = plain_scaler(cell, SCALER)
    pending = dict.fromkeys(models, 0)
    after: dict[str, list[list[torch.Tensor]]] = {name: [] for name in models}

    def divide(params: list[torch.Tensor]) -> None:
        with torch.no_grad():
            for param in params:
                if param.grad is not None:
                    param.grad /= world

    for batch_idx, calls in SEVERAL.items():
        stepped = False
        for name, make_optimizer_step in calls:
            blow_up = scaler is not None and (name, batch_idx) == SKIPPED_AT
            scaled_backward(oracle_loss(models[name], batches[batch_idx], cell, blow_up, factor=1.0), scaler, 2)
            pending[name] += 1
            closes = make_optimizer_step or (make_optimizer_step is None and batch_idx == len(SEVERAL) - 1)
            if closes:
                real_step(optimizers[name], pending[name], scaler, 2, reduce=divide)
                oracle_step_done(cell)
                pending[name], stepped = 0, True
        if stepped:
            update_scaler(scaler, [p for name in models if pending[name] for p in models[name].parameters()])
        for name, model in models.items():
            after[name].append(param_values(model.parameters(), to_cpu=True))
    return after


@pytest.mark.requirement("XLA-001", "AMP-004")
@pytest.mark.cells(devices=("xla",), precisions=("16-mixed",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "1 micro-step", "open while another optimizer steps"),
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward",),
    wrappers=("2",),
    loss_scale=("initial", "backed off"),
    reduction=("result", "count per window", "graph cuts per window"),
)
def test_each_window_is_reduced_once_and_a_skipped_step_cuts_once(
    make_context: MakeContext, cell: Cell, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two optimizers: each window reduced once, at its own real step; a skipped real step cuts the graph once.

    ``a`` takes a real step (skipped for overflow) while ``b`` only accumulates: ``a``'s call reduces and cuts
    once, ``b``'s window is left alone and reduced once at its own step, in the next batch, before ``a``'s.
    """
    world = _present_replicas(monkeypatch, cell)
    context = make_context(accumulate_grad_batches=2, grad_scaler=SCALER)
    models = {"a": context.prepare_module(make_model(seed=0)), "b": context.prepare_module(make_model(seed=1))}
    wrappers = {name: context.wrap(torch.optim.SGD(model.parameters(), lr=LR)) for name, model in models.items()}
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = make_batches(len(SEVERAL))
    expected = _several_oracle(cell, world)
    for batch_idx, calls in SEVERAL.items():
        start = _counts()
        real_steps = 0
        with context.batch(batch_idx, is_last=batch_idx == len(SEVERAL) - 1):
            for name, make_optimizer_step in calls:
                blow_up = (name, batch_idx) == SKIPPED_AT

                def closure(name: str = name, batch: Batch = batches[batch_idx], blow_up: bool = blow_up) -> Any:
                    with context.autocast():
                        loss = mse(models[name], batch, device, dtype)
                    loss = loss * float("inf") if blow_up else loss
                    wrappers[name].backward(loss)
                    return loss

                before = _counts()
                wrappers[name].step(closure, make_optimizer_step=make_optimizer_step)
                reductions = _counts().reductions - before.reductions
                outcome = wrappers[name].last_outcome
                where = f"{cell.id}, batch {batch_idx}, optimizer {name!r} ({outcome})"
                real = outcome in (StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE)
                assert real == (make_optimizer_step is not False), f"{where}: unexpected outcome [STEP-001]"
                assert outcome is not StepOutcome.STEPPED or (name, batch_idx) != SKIPPED_AT, (
                    f"{where}: the window's gradients are infinite, its real step must be skipped [AMP-004]"
                )
                real_steps += real
                if world > 1:
                    assert (reductions > 0) == real, (
                        f"{where}: {reductions} cross-replica reduction(s) in the call; a window is reduced at its "
                        "own real step and only there, another optimizer's open window is left alone [XLA-001]"
                    )
        cuts = _counts().cuts - start.cuts
        assert cuts == real_steps, (
            f"{cell.id}, batch {batch_idx}: {cuts} graph cut(s) in an iteration with {real_steps} real step(s) "
            "(a skipped one included); each real step cuts the graph once, a micro-step that accumulates never "
            "[XLA-001]"
        )
        for name, model in models.items():
            got = [param.detach().cpu() for param in model.parameters()]
            assert _close(got, expected[name][batch_idx], cell), (
                f"{cell.id}, after batch {batch_idx}: the parameters of {name!r} differ from the plain loop's, in "
                f"which each window's mean is reduced once over the {world} replicas shown, at its own real step "
                "[XLA-001]"
            )


@pytest.mark.requirement("ERR-006")
@pytest.mark.cells(devices=("xla",))  # no cell: n/a where the implementation does not claim xla
@pytest.mark.varies(faults=("invalid argument",))
def test_xla_without_torch_xla_names_it(implementation: ImplementationInfo[Any]) -> None:
    """Asking for device ``xla`` where torch_xla cannot be imported raises an error that names torch_xla."""
    if importlib.util.find_spec("torch_xla") is not None:
        unavailable("torch_xla is installed here, so its absence cannot be checked")
    with refuses(
        Exception,
        'factory(Cell("xla", "32-true")) where torch_xla cannot be imported',
        "ERR-006: device xla without torch_xla raises an error that names torch_xla",
        match="torch_xla",
    ) as raised:
        implementation.factory(Cell("xla", "32-true"))
    assert not isinstance(raised.value, AssertionError)
