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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance.assertions import assert_unchanged, snapshot
from lightning_optimizer.conformance.data_parallel import load
from lightning_optimizer.conformance.epoch_checks import assert_synced_ranks, first_difference, plain_epoch
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
from lightning_optimizer.conformance.plain_loop import train_windows, unscaled_finite
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.scenarios import (
    ACCUMULATE,
    EPOCH,
    build_model,
    build_sharded_optimizer,
    global_batches,
    plant_infinite_gradient,
    plant_row,
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


@dataclass(frozen=True)
class _Plan:
    """One sharded module's part of the epoch, as ``train_sharded_epoch`` takes it.

    ``raise_at``: the batches where a call whose closure raises after its backward comes first;
    ``user_sharded_blocks``: the scenario shards the module's ``Linear`` layers itself before ``prepare_module``.
    """

    module: str
    optimizer: str
    make_optimizer_step: tuple[bool | None, ...]
    raise_at: tuple[int, ...] = ()
    user_sharded_blocks: bool = False

    def windows(self, discarding: bool) -> tuple[list[list[int]], dict[int, int]]:
        """The windows by the rule, and the micro-steps the open window held at each failing call.

        ``True`` closes, ``False`` keeps open, ``None`` closes every third batch of the epoch and at the last one.
        ``discarding`` (policy ``"discard"``): a failed call discards its window, whose retry starts a new one.
        """
        windows: list[list[int]] = []
        current: list[int] = []
        held = {}
        for batch_idx, mos in enumerate(self.make_optimizer_step):
            if batch_idx in self.raise_at:
                held[batch_idx] = len(current)
                current = [] if discarding else current
            current.append(batch_idx)
            if mos if mos is not None else (batch_idx + 1) % ACCUMULATE == 0 or batch_idx == EPOCH - 1:
                windows.append(current)
                current = []
        return windows, held


def _drawn(
    seed: int, modules: Sequence[tuple[str, str]], raising: str = "", user_sharded_blocks: bool = False
) -> tuple[_Plan, ...]:
    """Plans with schedules drawn from ``seed`` (``None`` half the time, else ``True`` or ``False``).

    ``raising="accumulating"``: a call whose closure raises before the second micro-step of each window of three or
    more (its backward adds to FSDP's unsynced sums; the window then closes by calls that do not fail).
    ``"closing"``: before each real step that closes a window of several micro-steps (its backward syncs the whole
    window), and before the first micro-step that accumulates onto another.
    """
    rng = random.Random(seed)
    plans = []
    for module, optimizer in modules:
        schedule = tuple(rng.choice((None, None, True, False)) for _ in range(EPOCH))
        windows, _ = _Plan(module, optimizer, schedule).windows(discarding=False)
        accumulating = [window[1] for window in windows if len(window) > 2]
        closing = [window[-1] for window in windows if len(window) > 1]
        raise_at = {"": [], "accumulating": accumulating, "closing": [*closing, *accumulating[:1]]}[raising]
        plans.append(_Plan(module, optimizer, schedule, tuple(sorted(set(raise_at))), user_sharded_blocks))
    return tuple(plans)


def _check_failures(
    results: Sequence[dict[str, Any]], plans: Sequence[_Plan], held: Sequence[dict[int, int]], on_failure: str
) -> None:
    """What each failed call left on every rank: as before under ``"restore"``, discarded under ``"discard"``."""
    planned = sorted((batch_idx, j) for j, plan in enumerate(plans) for batch_idx in plan.raise_at)
    for rank, result in enumerate(results):
        failed = sorted((failure["batch"], failure["module"]) for failure in result["failures"])
        assert failed == planned, f"rank {rank}: the failing calls ran at {failed}, planned {planned}"
        for failure in result["failures"]:
            j, batch_idx, (before, after) = failure["module"], failure["batch"], failure["outcomes"]
            what = (
                f"rank {rank}, module {plans[j].module!r}, batch {batch_idx}: a step() whose closure raised after "
                f"its backward (on_failure={on_failure!r})"
            )
            if on_failure == "restore":
                assert after == before, f"{what} changed last_outcome from {before} to {after} [FAIL-004]"
                continue
            assert after is StepOutcome.DISCARDED, f"{what}: last_outcome {after}, expected DISCARDED [FAIL-003]"
            assert failure["grads_none"], f"{what}: gradients of the discarded window survived [FAIL-003]"
            error = RuntimeError("the planned failure")
            for note in failure["notes"]:
                error.add_note(note)
            kind = {"sgd": torch.optim.SGD, "adamw": torch.optim.AdamW}[plans[j].optimizer]
            assert_discard_note(error, kind, (held[j][batch_idx], held[j][batch_idx] + 1), what)


def _check_epoch(
    ranks: RankPool,
    cell: Cell,
    plans: Sequence[_Plan],
    *,
    form: str = "closure",
    clip: float | None = None,
    inf_at: tuple[int, int] | None = None,
    checkpoint_at: int | None = None,
    on_failure: str = "discard",
) -> None:
    """The epoch on every rank against one process on the global batch; ``inf_at=(batch, rank)`` plants an inf."""
    windows, held = zip(*(plan.windows(discarding=on_failure == "discard") for plan in plans), strict=True)
    closing = [{window[-1]: len(window) for window in ws} for ws in windows]
    requests = [asdict(plan) | {"sync_at": sorted(c)} for plan, c in zip(plans, closing, strict=True)]
    options = {"form": form, "clip": clip, "inf_at": inf_at, "checkpoint_at": checkpoint_at, "on_failure": on_failure}
    results = ranks.run("train_sharded_epoch", cell, plans=requests, **options)
    _check_failures(results, plans, held, on_failure)
    models = [oracle_copy(build_model(plan.module), cell) for plan in plans]
    clipped: list[bool] = []

    def clip_counted(params: list[torch.Tensor]) -> None:
        if clip is not None and unscaled_finite(params):
            clipped.append(float(torch.nn.utils.clip_grad_norm_(params, clip)) > clip)

    def plant(batch_idx: int, j: int) -> None:
        if inf_at is not None and (batch_idx, j) == (inf_at[0], 0):
            plant_infinite_gradient(models[0], row=plant_row(inf_at[1]))

    optimizers = [
        (model, build_sharded_optimizer(plan.optimizer, plan.module, model.parameters()))
        for plan, model in zip(plans, models, strict=True)
    ]
    calls = [[(j, c.get(b)) for j, c in enumerate(closing) if any(b in w for w in windows[j])] for b in range(EPOCH)]
    want, outcomes = plain_epoch(
        cell, optimizers, global_batches(2), calls, oracle_scaler(cell), clip=clip_counted, before_forward=plant
    )
    assert clip is None or any(clipped), f"the check's own oracle never clipped at {clip}: the check would not test it"
    shown = "; ".join(f"module {plan.module!r} {ws}" for plan, ws in zip(plans, windows, strict=True))
    shown += f"; a gradient element infinite in rank {inf_at[1]}'s shard, batch {inf_at[0]}" if inf_at else ""
    syncs = [
        [{b: c[j] for b, c in enumerate(r["reduce_scatters"]) if c[j]} for j in range(len(plans))] for r in results
    ]
    assert_synced_ranks(results, {p.module: ws for p, ws in zip(plans, windows, strict=True)}, syncs, form, SYNC_RULE)
    for rank, result in enumerate(results):
        for batch_idx, (got, expected) in enumerate(zip(result["outcomes"], outcomes, strict=True)):
            assert got == expected, (
                f"{form}, rank {rank}, batch {batch_idx}: the wrappers' last_outcome are {got}, expected {expected} "
                f"(windows {shown}): a non-finite gradient on any rank must skip the step on every rank "
                "[FSDP-004, STEP-004]"
            )
        if checkpoint_at is not None:
            differs = first_difference(result["resumed"], result["params"][checkpoint_at:])
            assert differs is None, (
                f"module {plans[differs[1]].module!r}, rank {rank}: parameters after batch "
                f"{checkpoint_at + differs[0]} differ between the run resumed from a checkpoint taken after batch "
                f"{checkpoint_at - 1} (windows {shown}) and the uninterrupted run; a sharded checkpoint (torch."
                "distributed.checkpoint, the context's state per rank) must resume bit for bit, open windows included "
                "[FSDP-006, CKPT-002]"
            )
    for batch_idx, (gathered, planned) in enumerate(zip(results[0]["params"], want, strict=True)):
        for j, plan in enumerate(plans):
            assert_params_close(
                load(cell, plan.module, gathered[j]),
                load(cell, plan.module, planned[j]),
                cell,
                f"{form}, module {plan.module!r} ({plan.optimizer}), after batch {batch_idx} (windows {windows[j]}"
                + (f", clipped to norm {clip}" if clip else "")
                + "): FSDP vs one process on the global batch [FSDP-003]",
                REORDERED_TOLERANCES[cell.precision],
            )


ONE = (("c", "sgd"),)
TWO = (("c", "adamw"), ("b", "sgd"))
TWO_SGD = (("c", "sgd"), ("a", "sgd"))
"""Clipped windows use SGD: AdamW divides the clipped, tiny gradients by their own root mean square, which lifts
the rounding of the reordered reduction above the tolerance of the comparison."""
CASES = {
    "1-module-sgd": (_drawn(1, ONE), "closure", None, "discard"),
    "1-module-sgd-clipped": (_drawn(2, ONE), "closure", CLIP, "discard"),
    "2-modules-adamw-sgd": (_drawn(3, TWO), "closure", None, "discard"),
    "2-modules-clipped": (_drawn(4, TWO_SGD), "closure", CLIP, "discard"),
    "2-modules-toggle": (_drawn(5, TWO), "toggle", None, "discard"),
    "2-modules-raising-closures-discard": (_drawn(6, TWO_SGD, "closing"), "closure", CLIP, "discard"),
    "2-modules-raising-closures-restore": (_drawn(6, TWO_SGD, "closing"), "closure", CLIP, "restore"),
    "2-modules-raising-accumulating-toggle-discard": (_drawn(16, TWO, "accumulating"), "toggle", None, "discard"),
    "2-modules-raising-accumulating-toggle-restore": (_drawn(16, TWO, "accumulating"), "toggle", None, "restore"),
    "user-sharded-blocks-discard": (_drawn(7, TWO, "closing", True), "closure", None, "discard"),
    "user-sharded-blocks-restore": (_drawn(7, TWO, "closing", True), "closure", None, "restore"),
}
"""Each case: the plans, the call form, the clipping and the failure policy (``"restore"`` where claimed)."""


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
    [pytest.param(name, marks=RESTORE if CASES[name][3] == "restore" else ()) for name in CASES],
)
def test_sharded_windows_match_one_process(ranks: RankPool, cell: Cell, case: str) -> None:
    """Drawn schedules, one or two sharded modules: one reduce-scatter round per window, the global-batch result.

    In the cases with raising closures (after their backward, on a closing call and on an accumulating one whose
    backward adds to FSDP's unsynced sums) the window is as before under ``"restore"``, unsynced sums included; under
    ``"discard"`` it is gone, unsynced sums included, and its retry starts a new window.
    """
    plans, form, clip, on_failure = CASES[case]
    _check_epoch(ranks, cell, plans, form=form, clip=clip, on_failure=on_failure)


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
        _Plan("c", "sgd", (None, None, None, True, None, None, None)),
        _Plan("b", "sgd", (False, True, False, False, True, None, None)),
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
        _Plan("c", "adamw", (False, True, None, False, None, None, None)),
        _Plan("b", "sgd", (None, None, True, True, False, None, None)),
    )
    _check_epoch(ranks, cell, plans, form=form, checkpoint_at=4)


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


def _load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, where: Path) -> None:
    """The model's and optimizer's states, saved through ``torch.distributed.checkpoint``, loaded into them."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, optimizer),
    }
    dcp_load(state, checkpoint_id=str(where))
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, optimizer, state["optim"])


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
    wrapper = context.wrap(build_sharded_optimizer("adamw", "c", model.parameters()))
    _load_sharded(model, wrapper.optimizer, tmp_path / "sharded")
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
    optimizer = build_sharded_optimizer("adamw", "c", oracle.parameters())
    train_windows(one, oracle, optimizer, batches, windows, oracle_scaler(one), accumulate=ACCUMULATE)
    assert_params_close(
        model,
        oracle,
        one,
        "three windows of AdamW, two on 2 FSDP ranks and the third in one process after resuming there, against "
        "one process on the global batch [FSDP-006]",
        REORDERED_TOLERANCES[cell.precision],
    )
