"""The pool of DDP ranks: results in rank order, and a rank that raises, dies or hangs fails in bounded time."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from lightning_optimizer.conformance.ranks import RankFailure, RankPool
from lightning_optimizer.spec import Cell

TESTS = str(Path(__file__).resolve().parent)
CELL = Cell("cpu", "32-true", 2)


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch) -> RankPool:
    monkeypatch.syspath_prepend(TESTS)  # spawned ranks inherit sys.path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, *sys.path]))
    return RankPool("lightning_optimizer.reference", "cpu", 2, scenarios="rank_scenarios", answer_timeout=8)


def test_results_come_back_in_rank_order_and_the_pool_is_reused(pool: RankPool) -> None:
    try:
        assert pool.run("rank_and_size", CELL) == [(0, 2), (1, 2)]
        assert pool.alive == 2
        assert pool.run("rank_and_size", CELL) == [(0, 2), (1, 2)]
    finally:
        pool.stop()
    assert pool.alive == 0


@pytest.mark.parametrize(
    ("scenario", "message"),
    [
        ("raises_on_rank_1", r"(?s)rank 1 raised .*rank 1 fails on purpose"),
        ("dies_on_rank_1", r"conformance-rank-1 died \(exit code 3\)"),
        ("hangs_on_rank_1", r"rank\(s\) \[0, 1\] did not answer within 8 s|rank\(s\) \[1\] did not answer"),
    ],
)
def test_a_failing_rank_fails_the_cell_in_bounded_time(pool: RankPool, scenario: str, message: str) -> None:
    pool.run("rank_and_size", CELL)
    started = time.monotonic()
    with pytest.raises(RankFailure, match=message):
        pool.run(scenario, CELL)
    assert time.monotonic() - started < 60, "the failure took too long to report"
    assert pool.alive == 0, "a rank process outlived the failure"
    assert pool.run("rank_and_size", CELL) == [(0, 2), (1, 2)], "the next cell did not get a fresh pool"
    pool.stop()
