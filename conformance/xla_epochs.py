"""XLA epochs on one device shown two replicas, observed through torch_xla's metrics, against the plain loop.

torch_xla is shown a world of two replicas (:func:`present_replicas`) on its one real device: a reduction across
replicas then halves the gradients, as if a second replica had contributed zero gradients, which the plain loop
(:func:`xla_oracle`) computes. :func:`xla_counts` reads torch_xla's metrics (its all-reduce counters, ``MarkStep``,
executed computations); :func:`check_xla_epoch` runs one optimizer's epoch and checks, per batch, when reductions
and graph cuts happen and that the parameters follow the reduced window means [XLA-001].
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, Literal

import pytest
import torch

from lightning_optimizer.conformance.data_parallel import Params, Plan, oracle
from lightning_optimizer.conformance.epoch_checks import assert_one_cut_per_real_step, assert_params, counted_clipper
from lightning_optimizer.conformance.harness import (
    make_batches,
    scaler_settings,
    tolerance_for,
)
from lightning_optimizer.conformance.optimizer_kinds import closure_of
from lightning_optimizer.conformance.plain_loop import rescale_grads
from lightning_optimizer.conformance.scenarios import ACCUMULATE, build_model
from lightning_optimizer.spec import Cell, GradScalerSettings, TrainingContext

__all__ = [
    "PRESENTED_WORLD_SIZE",
    "SCALER",
    "WRONG_REDUCTIONS",
    "Groups",
    "Reduction",
    "check_xla_epoch",
    "present_replicas",
    "xla_counts",
    "xla_oracle",
]

MakeContext = Callable[..., TrainingContext]
Groups = Callable[[torch.nn.Module], list[dict[str, Any]]]
"""A model's parameter groups for SGD."""

PRESENTED_WORLD_SIZE = 2
"""The number of replicas torch_xla is told about; the second one contributes nothing to a reduction."""
SCALER = GradScalerSettings(init_scale=2.0**8)
"""16-mixed: an initial scale at which this model's fp16 gradients stay finite, so that no step is skipped."""
Reduction = Literal["before clipping", "after clipping", "none"]
"""Where an oracle reduces each window's gradients: the rule (before clipping), or a wrong place, to diagnose."""
WRONG_REDUCTIONS: dict[Reduction, str] = {
    "none": "applied unreduced (never reduced, summed without the 1 / world_size scale, or reduced then overwritten)",
    "after clipping": "clipped before they were reduced",
}
"""The oracles of two wrong implementations, for the error message."""


def xla_counts() -> dict[str, int]:
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


def present_replicas(monkeypatch: pytest.MonkeyPatch, cell: Cell) -> int:
    """Show torch_xla a world of two replicas, where its backend can reduce the cell's gradients; the size shown."""
    import torch_xla.runtime as xr

    if cell.precision == "bf16-true" and xr.device_type() == "CPU":
        return 1  # the CPU backend refuses (or crashes on) a bfloat16 all-reduce
    for query in ("world_size", "global_runtime_device_count"):  # the runtime's two answers to "how many replicas"
        monkeypatch.setattr(xr, query, lambda: PRESENTED_WORLD_SIZE)
    return PRESENTED_WORLD_SIZE


def xla_oracle(
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


def check_xla_epoch(
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

    world = present_replicas(monkeypatch, cell)
    clipping = {"gradient_clip_val": clip_norm} if clip_norm else {}
    context = make_context(accumulate_grad_batches=ACCUMULATE, **clipping, **scaler_settings(cell, SCALER))
    model = context.prepare_module(build_model(plan.module))
    wrapper = context.wrap(torch.optim.SGD(groups(model)))
    backwards: list[dict[str, int]] = []
    handle = next(model.parameters()).register_hook(lambda grad: backwards.append(xla_counts()))
    params, cuts = {}, []
    for batch_idx, batch in enumerate(make_batches(len(plan.make_optimizer_step))):
        toggle, closes = batch_idx in backward_then_step, batch_idx in plan.closing
        closure, start = closure_of(context, wrapper, model, batch, cell), xla_counts()
        backwards.clear()
        with context.batch(batch_idx, is_last=batch_idx == len(plan.make_optimizer_step) - 1):
            if toggle:
                with wrapper.toggle_model():
                    closure()
            step_start = xla_counts()
            wrapper.step(None if toggle else closure, make_optimizer_step=plan.make_optimizer_step[batch_idx])
            step_end = xla_counts()
        end = xla_counts()
        form = "backward, then step()" if toggle else "closure"
        where = f"{cell.id}, batch {batch_idx} ({form} form) of windows {[list(w) for w in plan.windows]}"
        _assert_reduced_in_step(where, world, closes, backwards, (start, step_start, step_end, end))
        cuts.append(end["cuts"] - start["cuts"])
        if batch_idx >= plan.windows[0][-1]:
            xm.wait_device_ops()  # a graph cut launches its computation asynchronously
            settled = xla_counts()["executions"]
            params[batch_idx] = [[param.detach().cpu().clone() for param in model.parameters()]]
            read = xla_counts()["executions"] - settled
            assert read == 0 or not closes, (
                f"{where}: after the real step, reading the parameters ran {read} XLA computation(s): their "
                "update was still pending, so the graph was not cut after the inner optimizer step [XLA-001]"
            )
    handle.remove()
    assert_one_cut_per_real_step(cuts, [plan], cell.id, "XLA-001")
    _assert_xla_params(cell, world, plan, groups, params, clip_norm)


def _assert_reduced_in_step(
    where: str, world: int, closes: bool, backwards: list[dict[str, int]], counts: Sequence[dict[str, int]]
) -> None:
    """A batch's reductions: only in the step() that closes a window, after its last backward [XLA-001].

    ``backwards``: the counts at each backward pass of the batch; ``counts``: at the batch's start, at its step()'s
    start and end, at its end.
    """
    start, step_start, step_end, end = counts
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


def _assert_xla_params(
    cell: Cell,
    world: int,
    plan: Plan,
    groups: Groups,
    params: dict[int, list[list[torch.Tensor]]],
    clip_norm: float | None,
) -> None:
    """The parameters after each batch of ``params`` are the oracle's, with a hint where a wrong oracle's match."""
    clip, clipped = counted_clipper(clip_norm) if clip_norm else (None, [])
    expected = xla_oracle(cell, world, [plan], groups, accumulate=ACCUMULATE, clip=clip)
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
                xla_oracle(cell, world, [plan], groups, reduction, accumulate=ACCUMULATE, clip=clip)[batch_idx][0],
                cell,
            )
        )

    what = f"{cell.id}: each real step applies the window's mean gradient {reduced}, clipped if configured [XLA-001]"
    assert_params(cell, [plan], params, expected, what, hint=hint)
