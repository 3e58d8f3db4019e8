"""Checks of DDP cells (world size 2): one gradient all-reduce per window, the same parameters on every rank."""

from __future__ import annotations

import pytest
import torch

from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, assert_params_close, make_model
from lightning_optimizer.conformance.oracles import WindowOracle, expected_outcomes, oracle_copy
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.scenarios import ACCUMULATE, BATCHES, rank_batches
from lightning_optimizer.spec import Cell, StepOutcome

A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED
WINDOWS = [list(range(start, start + ACCUMULATE)) for start in range(0, BATCHES, ACCUMULATE)]


def _check_ranks(results: list[dict[str, object]], cell: Cell, form: str) -> None:
    first, *others = results
    for rank, result in enumerate(others, start=1):
        for i, (a, b) in enumerate(zip(first["params"], result["params"], strict=True)):  # type: ignore[call-overload]
            assert torch.equal(a, b), f"{form}: parameter {i} differs between rank 0 and rank {rank}"
    for rank, result in enumerate(results):
        assert result["all_reduces"] == len(WINDOWS), (
            f"{form}: rank {rank} ran {result['all_reduces']} gradient all-reduces for {len(WINDOWS)} windows of "
            f"{ACCUMULATE} micro-steps; micro-steps that do not close a window must run under no_sync()"
        )
    global_batches = [
        (torch.cat([shard[0] for shard in shards]), torch.cat([shard[1] for shard in shards]))
        for shards in zip(*(rank_batches(rank) for rank in range(cell.world_size)), strict=True)
    ]
    base = make_model()
    reference_model = oracle_copy(base, cell)
    oracle = WindowOracle(reference_model, torch.optim.SGD(reference_model.parameters(), lr=0.1, momentum=0.9), cell)
    oracle.train_windows(global_batches, WINDOWS)
    expected = expected_outcomes([A, A, S] * len(WINDOWS), oracle.stepped)
    assert first["outcomes"] == expected, f"{form}: outcomes {first['outcomes']}, expected {expected}"
    got = oracle_copy(base, cell)
    with torch.no_grad():
        for param, value in zip(got.parameters(), first["params"], strict=True):  # type: ignore[call-overload]
            param.copy_(value)
    assert_params_close(
        got,
        reference_model,
        cell,
        f"{form}: DDP vs one process on the global batch",
        REORDERED_TOLERANCES[cell.precision],
    )


@pytest.mark.requirement("DDP-001", "DDP-002")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,))
def test_closure_form_syncs_once_per_window(ranks: RankPool, cell: Cell) -> None:
    """Closure form: the wrapper runs non-closing micro-steps under ``no_sync``; ranks agree with the oracle."""
    _check_ranks(ranks.run("train_windows_on_shards", cell, form="closure"), cell, "closure form")


@pytest.mark.requirement("TOGGLE-003", "DDP-002")
@pytest.mark.cells(devices=("cpu", "cuda"), world_sizes=(2,))
def test_backward_then_step_syncs_through_toggle_model(ranks: RankPool, cell: Cell) -> None:
    """Backward-then-step form with ``toggle_model(sync_grad=...)``: one all-reduce per window as well."""
    _check_ranks(ranks.run("train_windows_on_shards", cell, form="backward-then-step"), cell, "backward-then-step")
