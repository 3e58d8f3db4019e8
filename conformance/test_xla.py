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
from typing import Any, Literal

import pytest
import torch

from lightning_optimizer.conformance.data_parallel import SCHEDULE_CUT_SHORT_KEPT_OPEN, Params, Plan, oracle
from lightning_optimizer.conformance.epoch_checks import assert_one_cut_per_real_step, assert_params, counted_clipper
from lightning_optimizer.conformance.harness import (
    Batch,
    cell_device,
    cell_dtype,
    make_batches,
    mse,
    refuses,
    scaler_settings,
    tolerance_for,
)
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.plain_loop import rescale_grads
from lightning_optimizer.conformance.scenarios import ACCUMULATE, build_model
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


def _counts() -> dict[str, int]:
    """torch_xla's metrics so far: cross-replica reductions (all-reduce counters), graph cuts, executed computations."""
    import torch_xla.debug.metrics

    met: Any = torch_xla.debug.metrics  # torch_xla leaves these functions unannotated
    value = {name: int(met.counter_value(name) or 0) for name in met.counter_names()}
    reduce = [v for n, v in value.items() if n.lower().replace("_", "").removeprefix("xla::").startswith("allreduce")]
    return {
        "reductions": sum(reduce),
        "cuts": value.get("MarkStep", 0),
        "executions": value.get("ExecuteComputation", 0),
    }


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
    blow_up: bool,
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
    plans: Sequence[Plan],
    groups: Groups,
    reduction: Reduction = "before clipping",
    **options: Any,
) -> Params:
    """Plain PyTorch on the XLA device (:func:`.data_parallel.oracle` with ``options``): SGD on each model's ``groups``.

    Each window's mean is reduced over the ``world`` shown (a sum over the one real replica, scaled by ``1 / world``),
    then (16-mixed) unscaled, clipped, stepped, and the graph cut. ``reduction`` moves the division after the
    clipping, or drops it: the oracles of wrong implementations.
    """
    divide, clip = functools.partial(rescale_grads, factor=1 / world), options.pop("clip", None)

    def clip_then(params: list[torch.Tensor]) -> None:
        if clip is not None:
            clip(params)
        if reduction == "after clipping":
            divide(params)

    batches, reduce = (
        make_batches(len(plans[0].make_optimizer_step)),
        divide if reduction == "before clipping" else None,
    )
    options |= {"batches": batches, "reduce": reduce, "clip": clip_then, "scaler": SCALER, "factor": 1.0}
    return oracle(cell, plans, optimizer=lambda _, model: torch.optim.SGD(groups(model)), **options)[0]


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


def _check_epoch(
    make_context: MakeContext,
    cell: Cell,
    monkeypatch: pytest.MonkeyPatch,
    plan: Plan,
    groups: Groups,
    clip_norm: float | None = None,
    backward_then_step: frozenset[int] = frozenset(),
) -> None:
    """Run the plan's epoch in a world of two replicas: reductions and cuts per batch, then the parameters.

    The batches in ``backward_then_step`` run their backward in a ``toggle_model()`` block before a bare ``step()``,
    the others a closure. Only the step() that closes a window reduces, after the window's last backward (seen by a
    gradient hook), and its iteration cuts the graph once, after the inner step: reading the parameters then runs
    no computation. From the first real step on (before it they may be pending casts) they are the oracle's.
    """
    import torch_xla.core.xla_model as xm

    world = _present_replicas(monkeypatch, cell)
    clipping = {"gradient_clip_val": clip_norm} if clip_norm else {}
    context = make_context(accumulate_grad_batches=ACCUMULATE, **clipping, **scaler_settings(cell, SCALER))
    model = context.prepare_module(build_model(plan.module))
    wrapper = context.wrap(torch.optim.SGD(groups(model)))
    backwards: list[dict[str, int]] = []
    handle = next(model.parameters()).register_hook(lambda grad: backwards.append(_counts()))
    params, cuts = {}, []
    for batch_idx, batch in enumerate(make_batches(len(plan.make_optimizer_step))):
        toggle, closes = batch_idx in backward_then_step, batch_idx in plan.closing
        closure, start = _closure(context, model, wrapper, batch, cell, False), _counts()
        backwards.clear()
        with context.batch(batch_idx, is_last=batch_idx == len(plan.make_optimizer_step) - 1):
            if toggle:
                with wrapper.toggle_model():
                    closure()
            step_start = _counts()
            wrapper.step(None if toggle else closure, make_optimizer_step=plan.make_optimizer_step[batch_idx])
            step_end = _counts()
        end = _counts()
        form = "backward, then step()" if toggle else "closure"
        where = f"{cell.id}, batch {batch_idx} ({form} form) of windows {[list(w) for w in plan.windows]}"
        assert len(backwards) == 1, f"{where}: expected the batch's one backward pass, saw {len(backwards)} [XLA-001]"
        in_step = step_end["reductions"] - max(backwards[0]["reductions"], step_start["reductions"])
        outside = end["reductions"] - start["reductions"] - (in_step if closes else 0)
        assert world == 1 or outside == 0, (
            f"{where}: {outside} cross-replica reduction(s) ran in the iteration "
            + (
                "outside the step() that closes the window after its last backward"
                if closes
                else "of a micro-step that accumulates (the window is still open)"
            )
            + "; a window is reduced once, in its real step after its last backward, before the inner steps [XLA-001]"
        )
        assert world == 1 or in_step > 0 or not closes, (
            f"{where}: this batch's step() takes the window's real step, but no cross-replica reduction of the "
            f"gradients ran in it after the window's last backward (torch_xla was shown {world} replicas) [XLA-001]"
        )
        cuts.append(end["cuts"] - start["cuts"])
        if batch_idx >= plan.windows[0][-1]:
            xm.wait_device_ops()  # a graph cut launches its computation asynchronously
            settled = _counts()["executions"]
            params[batch_idx] = [[param.detach().cpu().clone() for param in model.parameters()]]
            read = _counts()["executions"] - settled
            assert read == 0 or not closes, (
                f"{where}: after the real step, reading the parameters ran {read} XLA computation(s): their "
                "update was still pending, so the graph was not cut after the inner optimizer step [XLA-001]"
            )
    handle.remove()
    assert_one_cut_per_real_step(cuts, [plan], cell.id, "XLA-001")
    clip, clipped = counted_clipper(clip_norm) if clip_norm else (None, [])
    expected = _oracle(cell, world, [plan], groups, accumulate=ACCUMULATE, clip=clip)
    assert clip_norm is None or any(clipped), f"the check's own oracle never clipped at {clip_norm}"
    reduced = (
        f"reduced over the {world} replicas torch_xla was shown (the second contributing zero gradients: half the mean)"
        if world > 1
        else "(one replica: nothing to reduce)"
    )

    def hint(batch_idx: int, got: list[torch.Tensor]) -> str:
        return "".join(
            f"; they match an oracle whose window gradients were {meaning}"
            for reduction, meaning in WRONG_REDUCTIONS.items()
            if world > 1
            and (clip_norm is not None or reduction == "none")
            and _close(
                got,
                _oracle(cell, world, [plan], groups, reduction, accumulate=ACCUMULATE, clip=clip)[batch_idx][0],
                cell,
            )
        )

    what = f"{cell.id}: each real step applies the window's mean gradient {reduced}, clipped if configured [XLA-001]"
    assert_params(cell, [plan], params, expected, what, hint=hint)


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


SEVERAL = (Plan("a", (False, True, None), ((0, 1), (2,))), Plan("b", (False, False, True), ((0, 1, 2),)))
"""With ``accumulate_grad_batches=2``, three batches (only the last left to the cadence): ``a`` closes a window of 2
at batch 1 while ``b`` accumulates (under 16-mixed ``a``'s step there is skipped, its loss infinite); ``b`` closes a
window of 3 at batch 2, then ``a``'s new window of one micro-step is flushed by the last batch."""
ORDER = ("ab", "ab", "ba")
"""Each batch's calls, in order: in batch 2 ``b`` steps before ``a``."""
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
    plans = {plan.module: plan for plan in SEVERAL}
    models = {name: context.prepare_module(build_model(name)) for name in plans}
    wrappers = {name: context.wrap(torch.optim.SGD(model.parameters(), lr=LR)) for name, model in models.items()}
    blow_up = {(SKIPPED_AT[1], list(plans).index(SKIPPED_AT[0]))}
    expected = _oracle(cell, world, SEVERAL, _one_group, accumulate=2, blow_up=blow_up)
    params, cuts = {}, []
    for batch_idx, (order, batch) in enumerate(zip(ORDER, make_batches(len(ORDER)), strict=True)):
        start = _counts()
        with context.batch(batch_idx, is_last=batch_idx == len(ORDER) - 1):
            for name in order:
                skipped, make_optimizer_step = (
                    (name, batch_idx) == SKIPPED_AT,
                    plans[name].make_optimizer_step[batch_idx],
                )
                closure = _closure(context, models[name], wrappers[name], batch, cell, skipped)
                before = _counts()
                wrappers[name].step(closure, make_optimizer_step=make_optimizer_step)
                reductions = _counts()["reductions"] - before["reductions"]
                outcome = wrappers[name].last_outcome
                where = f"{cell.id}, batch {batch_idx}, optimizer {name!r} ({outcome})"
                real = outcome in (StepOutcome.STEPPED, StepOutcome.SKIPPED_NON_FINITE)
                assert real == (make_optimizer_step is not False), f"{where}: unexpected outcome [STEP-001]"
                assert outcome is not StepOutcome.STEPPED or not skipped, (
                    f"{where}: the window's gradients are infinite, its real step must be skipped [AMP-004]"
                )
                assert world == 1 or (reductions > 0) == real, (
                    f"{where}: {reductions} cross-replica reduction(s) in the call; a window is reduced at its "
                    "own real step and only there, another optimizer's open window is left alone [XLA-001]"
                )
        cuts.append(_counts()["cuts"] - start["cuts"])
        params[batch_idx] = [[p.detach().cpu() for p in model.parameters()] for model in models.values()]
    assert_one_cut_per_real_step(cuts, SEVERAL, f"{cell.id} (a skipped real step cuts too)", "XLA-001")
    reduced = f"each window's mean reduced once over the {world} replicas shown, at its own real step [XLA-001]"
    assert_params(cell, SEVERAL, params, expected, f"{cell.id}: the plain loop, {reduced}")


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
