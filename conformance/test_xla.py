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
from collections.abc import Callable
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.data_parallel import SCHEDULE_CUT_SHORT_KEPT_OPEN, Plan
from lightning_optimizer.conformance.epoch_checks import assert_one_cut_per_real_step, assert_params
from lightning_optimizer.conformance.harness import make_batches, refuses
from lightning_optimizer.conformance.optimizer_kinds import closure_of
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.scenarios import build_model
from lightning_optimizer.conformance.xla_epochs import (
    SCALER,
    check_xla_epoch,
    present_replicas,
    xla_counts,
    xla_oracle,
)
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome, TrainingContext

MakeContext = Callable[..., TrainingContext]

LR = 0.5
"""Large enough that a window applied unreduced (twice the expected gradient) moves parameters far off."""
CLIP_NORM = 0.7
"""Between the 2-norm of the first window's reduced mean gradient (0.48) and twice that: the reduced gradient is not
clipped, the unreduced one would be, and one clipped before its reduction comes out at half the threshold. The
second window's reduced gradient is longer (2.6) and clipped: one clipped before its reduction is half as long."""


def _one_group(model: torch.nn.Module) -> list[dict[str, Any]]:
    return [{"params": list(model.parameters()), "lr": LR}]


def _two_groups(model: torch.nn.Module) -> list[dict[str, Any]]:
    assert isinstance(model, torch.nn.Sequential)
    return [{"params": list(model[0].parameters()), "lr": LR}, {"params": list(model[2].parameters()), "lr": LR / 4}]


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
    check_xla_epoch(make_context, cell, monkeypatch, WINDOWS, _one_group, backward_then_step=BACKWARD_THEN_STEP)


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
    check_xla_epoch(make_context, cell, monkeypatch, CLIPPED, _two_groups, clip_norm=CLIP_NORM)


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
    world = present_replicas(monkeypatch, cell)
    context = make_context(accumulate_grad_batches=2, grad_scaler=SCALER)
    plans = {plan.module: plan for plan in SEVERAL}
    models = {name: context.prepare_module(build_model(name)) for name in plans}
    wrappers = {name: context.wrap(torch.optim.SGD(model.parameters(), lr=LR)) for name, model in models.items()}
    blow_up = {(SKIPPED_AT[1], list(plans).index(SKIPPED_AT[0]))}
    expected = xla_oracle(cell, world, SEVERAL, _one_group, accumulate=2, blow_up=blow_up)
    params, cuts = {}, []
    for batch_idx, (order, batch) in enumerate(zip(ORDER, make_batches(len(ORDER)), strict=True)):
        start = xla_counts()
        with context.batch(batch_idx, is_last=batch_idx == len(ORDER) - 1):
            for name in order:
                skipped, make_optimizer_step = (
                    (name, batch_idx) == SKIPPED_AT,
                    plans[name].make_optimizer_step[batch_idx],
                )
                closure = closure_of(context, wrappers[name], models[name], batch, cell, skipped)
                before = xla_counts()
                wrappers[name].step(closure, make_optimizer_step=make_optimizer_step)
                reductions = xla_counts()["reductions"] - before["reductions"]
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
        cuts.append(xla_counts()["cuts"] - start["cuts"])
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
