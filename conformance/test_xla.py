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

import functools
import importlib.util
from collections.abc import Callable, Sequence
from typing import Any, Literal, NamedTuple

import pytest
import torch

from lightning_optimizer.conformance.data_parallel import SCHEDULE_CUT_SHORT_KEPT_OPEN, Plan
from lightning_optimizer.conformance.epoch_checks import Calls, Params, plain_epoch
from lightning_optimizer.conformance.harness import (
    Batch,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
    refuses,
    tolerance_for,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.plain_loop import clipper, plain_scaler, rescale_grads
from lightning_optimizer.conformance.scenarios import ACCUMULATE
from lightning_optimizer.spec import (
    Cell,
    GradScalerSettings,
    ImplementationInfo,
    OptimizerWrapper,
    StepOutcome,
    TrainingContext,
)

MakeContext = Callable[..., TrainingContext]
Groups = Callable[[torch.nn.Module], list[dict[str, Any]]]

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
Reduction = Literal["before clipping", "after clipping", "none"]
"""Where an oracle reduces each window's gradients: the rule (before clipping), or a wrong place, to diagnose."""
WRONG_REDUCTIONS: dict[Reduction, str] = {
    "none": "applied unreduced (never reduced, summed without the 1 / world_size scale, or reduced then overwritten)",
    "after clipping": "clipped before they were reduced",
}
"""The oracles of two wrong implementations, for the error message."""


class _Counts(NamedTuple):
    """torch_xla's counts so far: cross-replica reductions, graph cuts, executed computations."""

    reductions: int
    cuts: int
    executions: int


def _counts() -> _Counts:
    """From torch_xla's metrics: its all-reduce counters (``xla::AllReduceInPlace``, ``xla::AllReduce``, c10d's)..."""
    import torch_xla.debug.metrics

    met: Any = torch_xla.debug.metrics  # torch_xla leaves these functions unannotated

    def value(name: str) -> int:
        return int(met.counter_value(name) or 0)

    reductions = [
        n for n in met.counter_names() if n.lower().replace("_", "").removeprefix("xla::").startswith("allreduce")
    ]
    return _Counts(sum(map(value, reductions)), value("MarkStep"), value("ExecuteComputation"))


def _present_replicas(monkeypatch: pytest.MonkeyPatch, cell: Cell) -> int:
    """Show torch_xla a world of two replicas, where its backend can reduce the cell's gradients; the size shown."""
    import torch_xla.runtime as xr

    if cell.precision == "bf16-true" and xr.device_type() == "CPU":
        return 1  # the CPU backend refuses (or crashes on) a bfloat16 all-reduce
    for query in ("world_size", "global_runtime_device_count"):  # the runtime's two answers to "how many replicas"
        monkeypatch.setattr(xr, query, lambda: PRESENTED_WORLD_SIZE)
    return PRESENTED_WORLD_SIZE


def _closure(
    context: TrainingContext,
    model: torch.nn.Module,
    wrapper: OptimizerWrapper[Any],
    batch: Batch,
    cell: Cell,
    blow_up: bool = False,
) -> Callable[[], torch.Tensor]:
    """A micro-step: the model's MSE on ``batch`` in the context's autocast (infinite with ``blow_up``); backward."""

    def closure() -> torch.Tensor:
        with context.autocast():
            loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
        loss = loss * float("inf") if blow_up else loss
        wrapper.backward(loss)
        return loss

    return closure


def _oracle(
    cell: Cell,
    world: int,
    groups: Sequence[Groups],
    calls: Calls,
    reduction: Reduction = "before clipping",
    **options: Any,
) -> tuple[Params, list[list[StepOutcome]]]:
    """Plain PyTorch on the XLA device (:func:`.epoch_checks.plain_epoch` with ``options``): SGD on ``groups[j]``.

    Model ``j`` is ``make_model(seed=j)``; each window's mean is reduced over the ``world`` shown (a sum over the one
    real replica, scaled by ``1 / world``), then (16-mixed) unscaled, clipped, stepped, and the graph cut.
    ``reduction`` moves the division after the clipping, or drops it: the oracles of wrong implementations.
    """
    models = [oracle_copy(make_model(seed=j), cell) for j in range(len(groups))]
    divide, clip = functools.partial(rescale_grads, factor=1 / world), options.pop("clip", None)

    def clip_then(params: list[torch.Tensor]) -> None:
        if clip is not None:
            clip(params)
        if reduction == "after clipping":
            divide(params)

    optimizers = [(model, torch.optim.SGD(group(model))) for model, group in zip(models, groups, strict=True)]
    reduce = divide if reduction == "before clipping" else None
    scaler, batches = plain_scaler(cell, SCALER), make_batches(len(calls))
    return plain_epoch(cell, optimizers, batches, calls, scaler, factor=1.0, reduce=reduce, clip=clip_then, **options)


def _close(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], cell: Cell) -> bool:
    tol = tolerance_for(cell)
    return all(
        torch.allclose(g.double(), w.double(), rtol=tol.rtol, atol=tol.atol) for g, w in zip(got, want, strict=True)
    )


def _one_group(model: torch.nn.Module) -> list[dict[str, Any]]:
    return [{"params": list(model.parameters()), "lr": LR}]


def _two_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    assert isinstance(model, torch.nn.Sequential)
    return [{"params": list(model[0].parameters()), "lr": LR}, {"params": list(model[2].parameters()), "lr": LR / 4}]


def _run_epoch(
    context: TrainingContext,
    model: torch.nn.Module,
    wrapper: OptimizerWrapper[Any],
    plan: Plan,
    cell: Cell,
    world: int,
    backward_then_step: frozenset[int],
) -> dict[int, list[torch.Tensor]]:
    """Drive the plan's epoch, checking each iteration's reductions (with ``world`` 1 they leave none) and graph cuts.

    The batches in ``backward_then_step`` run their backward in a ``toggle_model()`` block before a bare ``step()``,
    the others a closure.

    Only the step() that closes a window reduces, after the window's last backward (seen by a gradient hook), and its
    iteration cuts the graph once, after the inner step: reading the parameters then runs no computation. Returns
    the parameters after each iteration from the first real step on (before it they may be pending casts).
    """
    import torch_xla.core.xla_model as xm

    last = plan.windows[-1][-1]
    batches = make_batches(last + 1)
    backwards: list[_Counts] = []
    handle = next(model.parameters()).register_hook(lambda grad: backwards.append(_counts()))
    params = {}
    for window in plan.windows:
        for batch_idx in window:
            toggle, closes = batch_idx in backward_then_step, batch_idx == window[-1]
            closure = _closure(context, model, wrapper, batches[batch_idx], cell)
            backwards.clear()
            start = _counts()
            with context.batch(batch_idx, is_last=batch_idx == last):
                if toggle:
                    with wrapper.toggle_model():
                        closure()
                step_start = _counts()
                wrapper.step(None if toggle else closure, make_optimizer_step=plan.make_optimizer_step[batch_idx])
                step_end = _counts()
            end = _counts()
            form = "backward, then step()" if toggle else "closure"
            where = f"{cell.id}, batch {batch_idx} ({form} form) of window {list(window)}"
            assert len(backwards) == 1, f"{where}: expected the batch's one backward pass, saw {len(backwards)}"
            in_step = step_end.reductions - max(backwards[0].reductions, step_start.reductions)
            outside = end.reductions - start.reductions - (in_step if closes else 0)
            assert world == 1 or outside == 0, (
                f"{where}: {outside} cross-replica reduction(s) ran in the iteration "
                + (
                    "outside the step() that closes the window after its last backward"
                    if closes
                    else "of a micro-step that accumulates (the window is still open)"
                )
                + "; a window is reduced once, in its real step after its last backward, before the inner steps"
            )
            assert world == 1 or in_step > 0 or not closes, (
                f"{where}: this batch's step() takes the window's real step, but no cross-replica reduction of the "
                f"gradients ran in it after the window's last backward (torch_xla was shown {world} replicas)"
            )
            cuts = end.cuts - start.cuts
            assert cuts == closes, (
                f"{where}: {cuts} graph cut(s) (torch_xla.sync / xm.mark_step) in the iteration; a window costs "
                "exactly one, in the iteration of its real step, and a micro-step that accumulates none"
            )
            if batch_idx >= plan.windows[0][-1]:
                xm.wait_device_ops()  # a graph cut launches its computation asynchronously
                settled = _counts().executions
                params[batch_idx] = [param.detach().cpu().clone() for param in model.parameters()]
                read = _counts().executions - settled
                assert read == 0 or not closes, (
                    f"{where}: after the real step, reading the parameters ran {read} XLA computation(s): their "
                    "update was still pending, so the graph was not cut after the inner optimizer step"
                )
    handle.remove()
    return params


def _check_epoch(
    make_context: MakeContext,
    cell: Cell,
    monkeypatch: pytest.MonkeyPatch,
    plan: Plan,
    groups: Groups,
    clip_norm: float | None = None,
    backward_then_step: frozenset[int] = frozenset(),
) -> None:
    """Run the plan's epoch in a world of two replicas; check reductions, cuts, and the parameters after each batch."""
    world = _present_replicas(monkeypatch, cell)
    settings: dict[str, Any] = {"accumulate_grad_batches": ACCUMULATE}
    if clip_norm is not None:
        settings["gradient_clip_val"] = clip_norm
    if cell.precision == "16-mixed":
        settings["grad_scaler"] = SCALER
    context = make_context(**settings)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(groups(model)))
    params = _run_epoch(context, model, wrapper, plan, cell, world, backward_then_step)
    calls = [[(0, plan.closing.get(batch_idx))] for batch_idx in range(len(plan.make_optimizer_step))]
    clip = clipper("norm", clip_norm) if clip_norm is not None else None
    options: dict[str, Any] = {"accumulate": ACCUMULATE, "clip": clip}
    expected, outcomes = _oracle(cell, world, [groups], calls, **options)
    assert all(StepOutcome.SKIPPED_NON_FINITE not in row for row in outcomes), (
        "the check's own oracle overflowed: its inputs need another scale"
    )
    reduced = (
        f"reduced over the {world} replicas torch_xla was shown (the second contributing zero gradients: half the mean)"
        if world > 1
        else "(one replica: nothing to reduce)"
    )
    tol = tolerance_for(cell)
    for batch_idx, got in params.items():
        if _close(got, expected[batch_idx][0], cell):
            continue
        diff, name = max(
            ((g.double() - w.double()).abs().max().item(), name)
            for (name, _), g, w in zip(model.named_parameters(), got, expected[batch_idx][0], strict=True)
        )
        hint = "".join(
            f"; they match an oracle whose window gradients were {meaning}"
            for reduction, meaning in WRONG_REDUCTIONS.items()
            if world > 1
            and (clip_norm is not None or reduction == "none")
            and _close(got, _oracle(cell, world, [groups], calls, reduction, **options)[0][batch_idx][0], cell)
        )
        raise AssertionError(
            f"{cell.id}: after batch {batch_idx} (windows {[list(w) for w in plan.windows]}) parameter {name!r} "
            f"differs from the plain-PyTorch oracle, whose every real step applies the window's mean gradient "
            f"{reduced}, then clipped when clipping is configured (max abs diff {diff:.3g}, rtol {tol.rtol}, atol "
            f"{tol.atol}){hint}"
        )


WINDOWS = SCHEDULE_CUT_SHORT_KEPT_OPEN
BACKWARD_THEN_STEP = frozenset({3, 4, 5})
"""With ``accumulate_grad_batches=3``, :data:`.data_parallel.SCHEDULE_CUT_SHORT_KEPT_OPEN`: a full window of 3
(closures), one cut short by True (backward, then step()), and a partial one (batch 5 held open by False, in the
backward-then-step form; batch 6 a closure) flushed by the epoch's last batch."""

CLIPPED = Plan("a", (None, False, None, None, None), ((0, 1, 2), (3, 4)))
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
    _check_epoch(make_context, cell, monkeypatch, WINDOWS, _one_group, backward_then_step=BACKWARD_THEN_STEP)


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


SEVERAL = {
    0: (("a", False, None), ("b", False, None)),
    1: (("a", True, 2), ("b", False, None)),
    2: (("b", True, 3), ("a", None, 1)),
}
"""Per batch, each optimizer's call in order, with the length of the window it closes (``accumulate_grad_batches=2``,
three batches): ``a`` closes a window of 2 at batch 1 while ``b`` accumulates (under 16-mixed ``a``'s step there is
skipped, its loss infinite); ``b`` closes a window of 3 at batch 2, then ``a``'s new window of one micro-step is
flushed by the last batch."""
SKIPPED_AT = ("a", 1)


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
    batches, index = make_batches(len(SEVERAL)), list(models).index
    calls = [[(index(name), length) for name, _, length in calls] for calls in SEVERAL.values()]
    blow_up = {(SKIPPED_AT[1], index(SKIPPED_AT[0]))}
    expected, _ = _oracle(cell, world, [_one_group] * 2, calls, accumulate=2, blow_up=blow_up)
    for batch_idx, calls_in_batch in SEVERAL.items():
        start, real_steps = _counts(), 0
        with context.batch(batch_idx, is_last=batch_idx == len(SEVERAL) - 1):
            for name, make_optimizer_step, _ in calls_in_batch:
                skipped = (name, batch_idx) == SKIPPED_AT
                closure = _closure(context, models[name], wrappers[name], batches[batch_idx], cell, skipped)
                before = _counts()
                wrappers[name].step(closure, make_optimizer_step=make_optimizer_step)
                reductions = _counts().reductions - before.reductions
                outcome = wrappers[name].last_outcome
                where = f"{cell.id}, batch {batch_idx}, optimizer {name!r} ({outcome})"
                real = outcome in (StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE)
                assert real == (make_optimizer_step is not False), f"{where}: unexpected outcome [STEP-001]"
                assert outcome is not StepOutcome.STEPPED or not skipped, (
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
        for j, (name, model) in enumerate(models.items()):
            assert _close([p.detach().cpu() for p in model.parameters()], expected[batch_idx][j], cell), (
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
