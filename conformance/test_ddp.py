"""Checks of DDP cells (world size 2): one gradient all-reduce per window, the same parameters on every rank.

Each check runs one epoch of seven batches with ``accumulate_grad_batches=3`` on every rank (the scenario
``train_epoch_on_shards``), then compares, after every batch and for every prepared module: the ranks with each
other (bit for bit), and rank 0 with a plain PyTorch loop on the global batch (every rank's shard), stepping at
the windows worked out by hand below. The process group's reducing operations are counted per micro-step
(:mod:`.collectives`), not inferred from the module's class: the same number in each micro-step that closes a
window of the module's optimizer, none in any other.
"""

from __future__ import annotations

import pytest

from lightning_optimizer.conformance.data_parallel import EVERY_SECOND_BATCH, SCHEDULE_CUT_SHORT_KEPT_OPEN
from lightning_optimizer.conformance.epoch_checks import check_epoch
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.spec import Cell

SYNC_RULES = {
    "closure": "micro-steps that do not close a window must run their closure under no_sync(), and each that closes "
    "one must sync, one gradient all-reduce [DDP-001]",
    "toggle": "toggle_model(sync_grad=False) must suppress the sync of every DDP module of the context, and "
    "sync_grad=True must let it sync, one gradient all-reduce [TOGGLE-003, DDP-001]",
}
"""Per call form, how a DDP module syncs: the rule every rank's all-reduces per window are checked against."""

DDP = ("train_epoch_on_shards", "DDP [DDP-002]")
"""The scenario every rank runs, and what ran the epoch (with its requirement) for the messages."""


ONE_MODULE = (SCHEDULE_CUT_SHORT_KEPT_OPEN,)
TWO_MODULES = (SCHEDULE_CUT_SHORT_KEPT_OPEN, EVERY_SECOND_BATCH)
WINDOWS = ("k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch")
TWO_MODULE_WINDOWS = (*WINDOWS, "1 micro-step", "open while another optimizer steps")


@pytest.mark.requirement("DDP-001", "DDP-002", "STEP-004")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,))
@pytest.mark.varies(
    window=WINDOWS,
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward",),
    modules=("1 prepared module",),
    wrappers=("1",),
    outcome_read=("after its own call",),
    reduction=("result", "count per window"),
    position=("inside batch()",),
    optimizer=("SGD momentum",),
)
def test_closure_form_syncs_once_per_window(ranks: RankPool, cell: Cell) -> None:
    """Closure form: non-closing micro-steps (False included) under ``no_sync``; cut-short and flushed windows sync."""
    check_epoch(ranks, cell, "closure", ONE_MODULE, *DDP, rule=SYNC_RULES["closure"])


@pytest.mark.requirement("TOGGLE-003", "DDP-002", "STEP-004")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,))
@pytest.mark.varies(
    window=WINDOWS,
    make_optimizer_step=("True", "False", "None"),
    call_form=("toggle_model block, then step()",),
    modules=("1 prepared module",),
    wrappers=("1",),
    outcome_read=("after its own call",),
    reduction=("result", "count per window"),
    position=("inside batch()",),
    optimizer=("SGD momentum",),
)
def test_backward_then_step_syncs_through_toggle_model(ranks: RankPool, cell: Cell) -> None:
    """Backward-then-step form with ``toggle_model(sync_grad=...)``: one all-reduce per window, of every shape."""
    check_epoch(ranks, cell, "toggle", ONE_MODULE, *DDP, rule=SYNC_RULES["toggle"])


@pytest.mark.requirement("DDP-001", "DDP-002", "STEP-004")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,))
@pytest.mark.varies(
    window=TWO_MODULE_WINDOWS,
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward", "closure, loss.backward"),
    modules=("2 prepared modules",),
    wrappers=("2",),
    outcome_read=("after its own call", "after every call of every wrapper"),
    reduction=("result", "count per window"),
    position=("inside batch()",),
    optimizer=("SGD", "SGD momentum"),
)
def test_closure_form_syncs_each_module_once_per_window(ranks: RankPool, cell: Cell) -> None:
    """Two prepared modules with their own cadences: each all-reduces once per window of its own optimizer."""
    check_epoch(ranks, cell, "closure", TWO_MODULES, *DDP, rule=SYNC_RULES["closure"])


@pytest.mark.requirement("TOGGLE-003", "DDP-002", "STEP-004")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,))
@pytest.mark.varies(
    window=TWO_MODULE_WINDOWS,
    make_optimizer_step=("True", "False", "None"),
    call_form=("toggle_model block, then step()",),
    modules=("2 prepared modules",),
    wrappers=("2",),
    outcome_read=("after its own call", "after every call of every wrapper"),
    reduction=("result", "count per window"),
    position=("inside batch()",),
    optimizer=("SGD", "SGD momentum"),
)
def test_toggle_model_suppresses_sync_of_every_module(ranks: RankPool, cell: Cell) -> None:
    """Two prepared modules: ``toggle_model(sync_grad=False)`` keeps every DDP module of the context from syncing."""
    check_epoch(ranks, cell, "toggle", TWO_MODULES, *DDP, rule=SYNC_RULES["toggle"])
