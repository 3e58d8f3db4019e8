"""DDP and FSDP2 in a real ``Trainer.fit`` on two gloo ranks: the forms the Lightning tests did not run yet.

``ReferenceDDPStrategy`` with manual optimization, ``self.manual_backward`` in either form (backward then
``step()``, and inside the closure); ``ReferenceFSDPStrategy`` with automatic optimization, and resumed with
``fit(ckpt_path=...)``. Every case runs in one launch of tests/lightning_scenarios/distributed.py (Lightning's own
launcher starts the second rank; the two ranks run the cases one after another), each checked against a plain
PyTorch loop on the global batches: both ranks' shards of each batch, one step per window on the mean of its
micro-batches' gradients.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")

from lightning_optimizer.conformance.harness import make_model
from lightning_optimizer.spec import StepOutcome

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))  # the scenarios package and test_lightning's helpers

from lightning_scenarios.distributed import (  # noqa: E402
    CASES,
    DDP_BATCHES,
    EVERY,
    FSDP_BATCHES,
    PER_RANK_BATCH,
    RESUME_AT_STEP,
    closes_window,
)
from lightning_scenarios.shared import Batch, regression_data  # noqa: E402
from test_lightning import (  # noqa: E402
    assert_equal_on_ranks_and_close,
    expected_outcomes,
    global_batches,
    run_scenario,
    windows_oracle,
)

REDUCE_SCATTERS_PER_ROUND = 2
"""One reduce-scatter per sharded ``Linear`` of the model (``make_model``'s two)."""


def windows_of(batches: int) -> list[list[int]]:
    """The windows :func:`closes_window` makes of ``batches`` batches, the last one cut short."""
    windows: list[list[int]] = [[]]
    for batch in range(batches):
        windows[-1].append(batch)
        if closes_window(batch, batches):
            windows.append([])
    return windows[:-1]


def plain_loop(batches: Sequence[Batch], windows: Sequence[Sequence[int]]) -> torch.nn.Module:
    """``ManualRegressor`` by hand on the global batches: one SGD step per window, on its mean gradient.

    A global batch's loss is the MSE over both ranks' shards (as many samples each), so its gradient is the mean of
    the ranks' gradients, which DDP's all-reduce computes.
    """
    model = make_model(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for window in windows:
        for batch in window:
            x, y = batches[batch]
            torch.nn.functional.mse_loss(model(x), y).backward()
        with torch.no_grad():
            for param in model.parameters():
                assert param.grad is not None
                param.grad /= len(window)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return model


def closing_batches(windows: Sequence[Sequence[int]], per_round: int = 1) -> list[int]:
    """Gradient collectives per batch when each window syncs once, in its closing batch."""
    closing = {window[-1] for window in windows}
    return [per_round if batch in closing else 0 for batch in range(windows[-1][-1] + 1)]


def outcome_values(windows: Sequence[Sequence[int]], *, automatic: bool = False) -> list[str]:
    """The outcomes a module records after each ``step()``: every batch's (manual), or each window's closing one
    (automatic: Lightning calls ``optimizer_step`` once per window)."""
    if automatic:
        return [StepOutcome.STEPPED.value] * len(windows)
    return [outcome.value for outcome in expected_outcomes(windows, [True] * len(windows))]


@pytest.fixture(scope="module")
def ranks_of(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    """Each case's results on ranks 0 and 1, from one launch of every case of :data:`CASES`."""
    out_dir = tmp_path_factory.mktemp("distributed")
    run_scenario("distributed", ",".join(CASES), out_dir)  # under run_scenario's hang guard
    return {case: [torch.load(out_dir / case / f"rank{rank}.pt") for rank in (0, 1)] for case in CASES}


@pytest.mark.parametrize("form", ["backward-then-step", "closure"])
def test_ddp_manual_backward_matches_the_global_batch_loop(
    form: str, ranks_of: dict[str, list[dict[str, Any]]]
) -> None:
    """``self.manual_backward`` on ``ReferenceDDPStrategy``, a window closed every 2 batches and the last batch.

    ``backward-then-step``: the backward in ``opt.toggle_model(sync_grad=closes)``, then
    ``opt.step(make_optimizer_step=closes)``; ``closure``: the backward in the closure of ``opt.step(closure, ...)``.
    Both ranks end equal to each other and to the plain loop, and DDP all-reduces once per window, in its last batch.
    """
    windows = windows_of(DDP_BATCHES)
    assert windows == [[0, 1], [2, 3], [4]]
    ranks = ranks_of[f"ddp-{form}"]
    oracle = plain_loop(global_batches(regression_data(PER_RANK_BATCH, 2 * DDP_BATCHES), PER_RANK_BATCH), windows)
    assert_equal_on_ranks_and_close(ranks, oracle, f"manual_backward, {form}, on 2 DDP ranks")
    for rank, result in enumerate(ranks):
        assert result["all_reduces"] == closing_batches(windows), f"rank {rank}: gradient all-reduces per batch"
        assert result["outcomes"] == outcome_values(windows), f"rank {rank}"
        assert result["global_step"] == len(windows)


FSDP_WINDOWS = windows_of(FSDP_BATCHES)
"""``accumulate_grad_batches=2`` over 9 batches (Lightning's rule is the manual cadence's): four full windows, then
the last batch's window of 1."""


def fsdp_oracle() -> torch.nn.Module:
    """``AutomaticWindowedRegressor`` (SGD, StepLR by step; ``WindowedRegressor`` too) by hand on the global batches."""
    batches = global_batches(regression_data(PER_RANK_BATCH, 2 * FSDP_BATCHES), PER_RANK_BATCH)
    return windows_oracle("32-true", batches, FSDP_WINDOWS, EVERY, epochs=1).model


def test_fsdp_automatic_optimization_matches_the_global_batch_loop(ranks_of: dict[str, list[dict[str, Any]]]) -> None:
    """Automatic optimization on ``ReferenceFSDPStrategy``, ``accumulate_grad_batches=2``, a last window of 1.

    The gathered parameters of both ranks equal the plain loop's; each window costs one reduce-scatter round, in
    its closing batch.
    """
    assert FSDP_WINDOWS == [[0, 1], [2, 3], [4, 5], [6, 7], [8]]
    ranks = ranks_of["fsdp-automatic"]
    assert_equal_on_ranks_and_close(ranks, fsdp_oracle(), "ReferenceFSDPStrategy, automatic, windows of 2")
    for rank, result in enumerate(ranks):
        expected = closing_batches(FSDP_WINDOWS, REDUCE_SCATTERS_PER_ROUND)
        assert result["reduce_scatters"] == expected, f"rank {rank}: reduce-scatters per batch"
        assert result["outcomes"] == outcome_values(FSDP_WINDOWS, automatic=True), f"rank {rank}"
        assert result["global_step"] == len(FSDP_WINDOWS)


@pytest.mark.parametrize("mode", ["automatic", "manual"])
def test_fsdp_fit_resumed_from_a_window_boundary_matches_the_uninterrupted_run(
    mode: str, ranks_of: dict[str, list[dict[str, Any]]]
) -> None:
    """A ``ModelCheckpoint`` saves at step 2 (after batch 3, the second window's end) and ``max_steps=2`` stops the
    run; a new Trainer and module resume it with ``fit(ckpt_path=...)`` for batches 4 to 8. The resumed run ends
    where an uninterrupted run ends, bit for bit, and where the plain loop ends.

    ``automatic``: ``AutomaticWindowedRegressor``, sharded; ``manual``: ``WindowedRegressor``, sharded, its windows
    closed by the Trainer's ``accumulate_grad_batches``. Both schedule StepLR per applied step: the same plain loop.
    """
    ranks = ranks_of[f"fsdp-resume-{mode}"]
    for rank, result in enumerate(ranks):
        cut, full, resumed = result["cut"], result["full"], result["resumed"]
        assert cut["checkpoint"] == {"global_step": RESUME_AT_STEP, "pending": [0, 0]}, (
            f"rank {rank}: the checkpoint is not at a window boundary"
        )
        automatic = mode == "automatic"
        assert cut["outcomes"] == outcome_values(FSDP_WINDOWS[:RESUME_AT_STEP], automatic=automatic)
        resumed_windows = FSDP_WINDOWS[RESUME_AT_STEP:]
        assert resumed["outcomes"] == outcome_values(resumed_windows, automatic=automatic), (
            f"rank {rank}: the resumed run's batches"
        )
        expected = closing_batches(FSDP_WINDOWS, REDUCE_SCATTERS_PER_ROUND)[resumed_windows[0][0] :]
        assert resumed["reduce_scatters"] == expected, f"rank {rank}: reduce-scatters per resumed batch"
        assert resumed["global_step"] == full["global_step"] == len(FSDP_WINDOWS)
        for i, (got, want) in enumerate(zip(resumed["params"], full["params"], strict=True)):
            assert torch.equal(got, want), f"rank {rank}: parameter {i} left the uninterrupted run's trajectory"
    oracle = fsdp_oracle()
    assert_equal_on_ranks_and_close([r["full"] for r in ranks], oracle, f"FSDP, {mode}, uninterrupted")
    assert_equal_on_ranks_and_close(
        [r["resumed"] for r in ranks], oracle, f"FSDP, {mode}, resumed with fit(ckpt_path=)"
    )
