"""Checks of sharded cells (FSDP2, world size 2): one reduce-scatter round per window, the single-process result.

Each check runs one epoch of seven batches with ``accumulate_grad_batches=3`` on every rank (the scenario
``train_sharded_epoch``): modules sharded by the implementation's ``prepare_module``, one of them with a hidden
layer of 7 units so that its shards are uneven, each with its own optimizer on two parameter groups. Schedules of
``make_optimizer_step`` are drawn from a seed; the windows they make are worked out below from the rule. After
every batch the gathered parameters are compared with a plain PyTorch loop on the global batch (every rank's
shard), and each call's reduce-scatters are counted: none in a micro-step that does not close its window, one
round in each that does.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_unchanged, snapshot
from lightning_optimizer.conformance.data_parallel import Plan
from lightning_optimizer.conformance.epoch_checks import assert_epoch, counted_clipper, first_difference
from lightning_optimizer.conformance.harness import (
    LOSS_FACTOR,
    REORDERED_TOLERANCES,
    Batch,
    assert_discard_note,
    assert_params_close,
    build_context,
    cell_device,
    cell_dtype,
    mse,
    oracle_scaler,
    refuses,
)
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import train_windows
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.scenarios import (
    ACCUMULATE,
    EPOCH,
    build_model,
    build_sharded_optimizer,
    global_batches,
    load_sharded,
)
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome

A = StepOutcome.ACCUMULATED
RESTORE = pytest.mark.features("exact_restore")
CLIP = 2e-4
"""A norm the windows' gradients exceed (their losses are scaled by ``LOSS_FACTOR``): clipping acts."""
SYNC_RULE = (
    "micro-steps that do not close a window must run without gradient sync, and every window costs the same one "
    "round (one reduce-scatter per FSDP unit) [FSDP-002]"
)


def _drawn(
    seed: int, modules: Sequence[tuple[str, str]], raising: str = "", blocks: bool = False, on_failure: str = "discard"
) -> tuple[Plan, ...]:
    """Plans with schedules drawn from ``seed`` (``None`` half the time, else ``True`` or ``False``), windows by rule.

    ``raising="accumulating"``: a call whose closure raises before the second micro-step of each window of three or
    more (its backward adds to FSDP's unsynced sums; the window then closes by calls that do not fail).
    ``"closing"``: before each real step that closes a window of several micro-steps (its backward syncs the whole
    window), and before the first micro-step that accumulates onto another. ``blocks``: ``user_sharded_blocks``.
    """
    rng = random.Random(seed)
    plans = []
    for module, optimizer in modules:
        schedule = tuple(rng.choice((None, None, True, False)) for _ in range(EPOCH))
        windows = Plan(module, schedule).windows
        accumulating = [window[1] for window in windows if len(window) > 2]
        closing = [window[-1] for window in windows if len(window) > 1]
        raise_at = {"": [], "accumulating": accumulating, "closing": [*closing, *accumulating[:1]]}[raising]
        raising_at = tuple(sorted(set(raise_at)))
        plans.append(Plan(module, schedule, (), optimizer, raising_at, on_failure, user_sharded_blocks=blocks))
    return tuple(plans)


def _check_failures(results: Sequence[dict[str, Any]], plans: Sequence[Plan]) -> None:
    """What each failed call left on every rank: as before under ``"restore"``, discarded under ``"discard"``."""
    planned = sorted((batch_idx, j) for j, plan in enumerate(plans) for batch_idx in plan.raise_at)
    for rank, result in enumerate(results):
        failed = sorted((failure["batch"], failure["module"]) for failure in result["failures"])
        assert failed == planned, f"rank {rank}: the failing calls ran at {failed}, expected {planned} [CLOS-003]"
        for failure in result["failures"]:
            plan, batch_idx, (before, after) = plans[failure["module"]], failure["batch"], failure["outcomes"]
            what = (
                f"rank {rank}, module {plan.module!r}, batch {batch_idx}: a step() whose closure raised after its "
                f"backward (on_failure={plan.on_failure!r})"
            )
            if plan.on_failure == "restore":
                assert after == before, f"{what} changed last_outcome from {before} to {after} [FAIL-004]"
                continue
            assert after is StepOutcome.DISCARDED, f"{what}: last_outcome {after}, expected DISCARDED [FAIL-003]"
            assert failure["grads_none"], f"{what}: gradients of the discarded window survived [FAIL-003]"
            error = RuntimeError("the planned failure")
            for note in failure["notes"]:
                error.add_note(note)
            held = plan.rule()[1][batch_idx]
            kind = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[plan.optimizer]
            assert_discard_note(error, kind, (held, held + 1), what)


def _check_epoch(
    ranks: RankPool,
    cell: Cell,
    plans: Sequence[Plan],
    form: str = "closure",
    clip: float | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """The epoch on every rank (``train_sharded_epoch`` with ``options``) against one process on the global batch.

    ``inf_at=(batch, rank)`` plants an infinite gradient element in the first module's shard on that rank.
    """
    requests = [asdict(plan) | {"sync_at": sorted(plan.closing)} for plan in plans]
    results = ranks.run(
        "train_sharded_epoch", cell, plans=requests, form=form, clip=clip, on_failure=plans[0].on_failure, **options
    )
    _check_failures(results, plans)
    inf_at = options.get("inf_at")
    run = "FSDP" + (f", clipped to norm {clip}" if clip else "") + " [FSDP-003]"
    if inf_at:
        run = f"FSDP, an infinite gradient element in rank {inf_at[1]}'s shard: skipped on every rank [FSDP-004]"
    clipping, clipped = counted_clipper(clip) if clip else (None, [])
    blow_up = {(inf_at[0], 0)} if inf_at else set()
    assert_epoch(cell, plans, results, form, run, rule=SYNC_RULE, clip=clipping, blow_up=blow_up)
    assert clip is None or any(clipped), f"the check's own oracle never clipped at {clip}: the check would not test it"
    return results


ONE = (("c", "sgd"),)
TWO = (("c", "adamw"), ("b", "sgd"))
TWO_SGD = (("c", "sgd"), ("a", "sgd"))
"""Clipped windows use SGD: AdamW divides the clipped, tiny gradients by their own root mean square, which lifts
the rounding of the reordered reduction above the tolerance of the comparison."""
CASES = {
    "1-module-sgd": (_drawn(1, ONE), "closure", None),
    "1-module-sgd-clipped": (_drawn(2, ONE), "closure", CLIP),
    "2-modules-adamw-sgd": (_drawn(3, TWO), "closure", None),
    "2-modules-clipped": (_drawn(4, TWO_SGD), "closure", CLIP),
    "2-modules-toggle": (_drawn(5, TWO), "toggle", None),
    "2-modules-raising-closures-discard": (_drawn(6, TWO_SGD, "closing"), "closure", CLIP),
    "2-modules-raising-closures-restore": (_drawn(6, TWO_SGD, "closing", on_failure="restore"), "closure", CLIP),
    "2-modules-raising-accumulating-toggle-discard": (_drawn(16, TWO, "accumulating"), "toggle", None),
    "2-modules-raising-accumulating-toggle-restore": (
        _drawn(16, TWO, "accumulating", on_failure="restore"),
        "toggle",
        None,
    ),
    "user-sharded-blocks-discard": (_drawn(7, TWO, "closing", True), "closure", None),
    "user-sharded-blocks-restore": (_drawn(7, TWO, "closing", True, "restore"), "closure", None),
}
"""Each case: the plans (with the failure policy, ``"restore"`` where claimed), the call form and the clipping."""


@pytest.mark.requirement("FSDP-001", "FSDP-002", "FSDP-003", "STEP-004", "CLOS-003", "FAIL-003", "FAIL-004")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,), strategies=("fsdp",))
@pytest.mark.varies(
    window=("1 micro-step", "k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch"),
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward", "toggle_model block, then step()"),
    modules=("1 prepared module", "2 prepared modules"),
    wrappers=("1", "2"),
    param_groups=("2 with other hyper-parameters",),
    optimizer=("SGD momentum", "AdamW"),
    clipping=("norm",),
    reduction=("result", "reduce-scatters per window"),
    position=("inside batch()",),
    faults=("raising closure after its backward",),
    on_failure=("discard", "restore"),
)
@pytest.mark.parametrize(
    "case",
    [pytest.param(name, marks=RESTORE if CASES[name][0][0].on_failure == "restore" else ()) for name in CASES],
)
def test_sharded_windows_match_one_process(ranks: RankPool, cell: Cell, case: str) -> None:
    """Drawn schedules, one or two sharded modules: one reduce-scatter round per window, the global-batch result.

    In the cases with raising closures (after their backward, on a closing call and on an accumulating one whose
    backward adds to FSDP's unsynced sums) the window is as before under ``"restore"``, unsynced sums included; under
    ``"discard"`` it is gone, unsynced sums included, and its retry starts a new window.
    """
    plans, form, clip = CASES[case]
    _check_epoch(ranks, cell, plans, form, clip)


@pytest.mark.requirement("FSDP-004", "AMP-003", "AMP-006")
@pytest.mark.cells(devices=("cpu", "cuda"), precisions=("16-mixed",), world_sizes=(2,), strategies=("fsdp",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "open while another optimizer steps", "open across a scale change"),
    modules=("2 prepared modules",),
    loss_scale=("initial", "backed off"),
    ranks=("overflow on one rank",),
    reduction=("result",),
)
@pytest.mark.parametrize("rank", [0, 1])
def test_overflow_on_one_rank_skips_everywhere(ranks: RankPool, cell: Cell, rank: int) -> None:
    """An infinite gradient in one rank's shard only: every rank skips that window; the scale backs off once."""
    plans = (
        Plan("c", (None, None, None, True, None, None, None), optimizer="sgd"),
        Plan("b", (False, True, False, False, True, None, None), optimizer="sgd"),
    )
    _check_epoch(ranks, cell, plans, inf_at=(1 + rank, rank))


@pytest.mark.requirement("FSDP-006", "CKPT-002")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,), strategies=("fsdp",))
@pytest.mark.features("checkpointing")
@pytest.mark.varies(
    window=("k >= 2 micro-steps", "open while another optimizer steps"),
    copies=("sharded checkpoint",),
    modules=("2 prepared modules",),
    optimizer=("SGD momentum", "AdamW"),
)
@pytest.mark.parametrize("form", ["closure", "toggle"])
def test_sharded_checkpoint_resumes_open_windows(ranks: RankPool, cell: Cell, form: str) -> None:
    """A checkpoint after batch 3, where one window is open and the other has just closed, resumes bit for bit."""
    plans = (
        Plan("c", (False, True, None, False, None, None, None), optimizer="adamw"),
        Plan("b", (None, None, True, True, False, None, None), optimizer="sgd"),
    )
    for rank, result in enumerate(_check_epoch(ranks, cell, plans, form, checkpoint_at=4)):
        differs = first_difference(result["resumed"], result["params"][4:])
        assert differs is None, (
            f"module {plans[differs[1]].module!r}, rank {rank}: parameters after batch {4 + differs[0]} differ "
            f"between the run resumed from a checkpoint taken after batch 3 (windows {[p.windows for p in plans]}) "
            "and the uninterrupted run; a sharded checkpoint (torch.distributed.checkpoint, the context's state per "
            "rank) must resume bit for bit, open windows included [FSDP-006, CKPT-002]"
        )


@pytest.mark.requirement("FSDP-005")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,), strategies=("fsdp",))
@pytest.mark.varies(
    window=("k >= 2 micro-steps",),
    make_optimizer_step=("None",),
    call_form=("toggle_model block, then step()",),
    faults=("invalid argument",),
)
def test_step_refuses_a_window_no_backward_synced(ranks: RankPool, cell: Cell) -> None:
    """Every backward of a window without gradient sync: its closing step refuses, and changes nothing."""
    for rank, result in enumerate(ranks.run("step_after_unsynced_backward", cell, module="c")):
        assert result["refused"] == "RuntimeError", (
            f"rank {rank}: the closing step() of a window whose every backward ran without gradient sync "
            f"{'returned' if result['refused'] is None else 'raised ' + result['refused']}; it must raise "
            "RuntimeError (its gradients never reached the shards, so the step would apply none of them) [FSDP-005]"
        )
        unchanged = all(torch.equal(a, b) for a, b in zip(result["before"], result["after"], strict=True))
        assert unchanged, f"rank {rank}: the refused step changed the parameters [FSDP-005]"
        assert result["outcomes"][0] == result["outcomes"][1] == A, (
            f"rank {rank}: last_outcome before and after the refused step {result['outcomes']}, expected both "
            "ACCUMULATED (a refused call changes nothing) [FSDP-005]"
        )


@pytest.mark.requirement("FSDP-006", "CKPT-003")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,), strategies=("fsdp",))
@pytest.mark.features("checkpointing")
@pytest.mark.varies(
    window=("k >= 2 micro-steps",),
    copies=("sharded checkpoint",),
    optimizer=("AdamW",),
    param_groups=("2 with other hyper-parameters",),
    faults=("invalid argument",),
)
def test_a_sharded_state_resumes_in_one_process(
    ranks: RankPool, cell: Cell, implementation: ImplementationInfo[Any], tmp_path: Path
) -> None:
    """Saved on two FSDP ranks, resumed in one process, where an open window's state is refused.

    With no window open it trains on as one process on the global batch would; with a window open the context
    state is refused with ``ValueError``, and nothing changes.
    """
    ranks.run("save_sharded_for_another_world_size", cell, root=str(tmp_path))
    one = Cell(cell.device, cell.precision)
    context = build_context(implementation.factory, one, accumulate_grad_batches=ACCUMULATE)
    model = context.prepare_module(build_model("c"))
    wrapper = context.wrap(build_sharded_optimizer("adamw", "c", model.parameters(), cell))
    load_sharded([model], [wrapper.optimizer], str(tmp_path / "sharded"))
    before, outcome = snapshot(model), wrapper.last_outcome
    with refuses(
        ValueError,
        "context.load_state_dict(a state saved on 2 FSDP ranks with a window open) in one process",
        "FSDP-006: each rank's part of an open window is its own shard of the global batch",
    ):
        context.load_state_dict(torch.load(tmp_path / "open-rank0.pt", weights_only=False))
    assert_unchanged(model, before, "the refused load of an open window's state [CKPT-003]")
    assert wrapper.last_outcome is outcome, "the refused load changed last_outcome [CKPT-003]"
    context.load_state_dict(torch.load(tmp_path / "closed-rank0.pt", weights_only=False))
    batches = global_batches(2, 3 * ACCUMULATE)
    device, dtype = cell_device(one), cell_dtype(one)
    for batch_idx in range(2 * ACCUMULATE, 3 * ACCUMULATE):

        def closure(batch: Batch = batches[batch_idx]) -> torch.Tensor:
            with context.autocast():
                loss = mse(model, batch, device, dtype) * LOSS_FACTOR
            wrapper.backward(loss)
            return loss

        with context.batch(batch_idx):
            wrapper.step(closure)
    oracle = oracle_copy(build_model("c"), one)
    windows = [range(start, start + ACCUMULATE) for start in range(0, len(batches), ACCUMULATE)]
    optimizer = build_sharded_optimizer("adamw", "c", oracle.parameters(), one)
    train_windows(one, oracle, optimizer, batches, windows, oracle_scaler(one), accumulate=ACCUMULATE)
    assert_params_close(
        model,
        oracle,
        one,
        "three windows of AdamW, two on 2 FSDP ranks and the third in one process after resuming there, against "
        "one process on the global batch [FSDP-006]",
        REORDERED_TOLERANCES[cell.precision],
    )
