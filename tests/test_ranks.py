"""The pool of DDP ranks: results in rank order, and a rank that raises, dies or hangs fails in bounded time.

Also inside an open accumulation window, where the other rank waits in DDP's gradient all-reduce: the failure is
reported in bounded time and leaves no rank process and no process group (its rendezvous port is closed).
"""

from __future__ import annotations

import multiprocessing
import os
import socket
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import pytest
import torch.distributed as dist

from lightning_optimizer.conformance import ranks
from lightning_optimizer.conformance.ranks import RankFailure, RankPool
from lightning_optimizer.spec import Cell, StepOutcome

TESTS = str(Path(__file__).resolve().parent)
CELL = Cell("cpu", "32-true", 2)
# A hang guard on every scenario's answer, never a speed check: the slowest, the first (its ranks import the
# implementation and build DDP), took 4.5 s on 2 cores beside other jobs (load 3.5); 300 s is 66 times that.
ANSWER_TIMEOUT_S = 300
HANG_ANSWER_TIMEOUT_S = 8
"""The answer timeout of the hang scenario, the failure that scenario expects: its rank 1 sleeps for 600 s, so no load
makes it answer in time; a slower machine only makes the pool wait a little longer than this for each answer."""
FAILURE_BOUND_S = 300
"""What "bounded time" means here: half the 600 s that the hanging rank sleeps (a pool that waited for it fails), far
above what a failure took on 2 cores beside other jobs (load 3.5): 10 s for the hang (its 8 s timeout, then 2 s for
the ranks to leave), 8 s for an abort (a crash, a fresh pool, a crash again), under 6 s for the others."""


@pytest.fixture
def ports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The rendezvous ports of the process groups that the pool starts."""
    started: list[int] = []
    free_port = ranks._free_port

    def recording_free_port() -> int:
        started.append(free_port())
        return started[-1]

    monkeypatch.setattr(ranks, "_free_port", recording_free_port)
    return started


def _listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def pool(monkeypatch: pytest.MonkeyPatch, ports: list[int]) -> RankPool:
    monkeypatch.syspath_prepend(TESTS)  # spawned ranks inherit sys.path
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([TESTS, *sys.path]))
    return RankPool(
        "lightning_optimizer.reference", "cpu", 2, scenarios="rank_scenarios", answer_timeout=ANSWER_TIMEOUT_S
    )


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
        ("aborts_on_rank_1", r"(?s)conformance-rank-1 died \(exit code -6\), the end of its log:.*on purpose.*Fatal"),
        (
            "hangs_on_rank_1",
            rf"rank\(s\) \[0, 1\] did not answer within {HANG_ANSWER_TIMEOUT_S} s|rank\(s\) \[1\] did not",
        ),
        ("raises_mid_window_on_rank_1", r"(?s)rank 1 raised .*rank 1 fails mid-window on purpose"),
        ("dies_mid_window_on_rank_1", r"conformance-rank-1 died \(exit code 3\)"),
    ],
)
def test_a_failing_rank_fails_the_cell_in_bounded_time(
    pool: RankPool, ports: list[int], scenario: str, message: str
) -> None:
    # The ranks import and build DDP once first (under the long answer timeout: a loaded machine is slow to start),
    # so that the timed scenario is the failure; a rank that raises or dies is seen at once, so only the hang
    # itself runs under the short answer timeout.
    assert pool.run("builds_a_ddp_window", CELL) == [[StepOutcome.ACCUMULATED]] * 2
    if scenario.startswith("hangs"):
        pool.answer_timeout = HANG_ANSWER_TIMEOUT_S
    started = time.monotonic()
    crashes = pytest.warns(ranks.RankCrashWarning) if scenario.startswith("aborts") else nullcontext()
    with crashes, pytest.raises(RankFailure, match=message):
        pool.run(scenario, CELL)
    assert time.monotonic() - started < FAILURE_BOUND_S, "the failure took too long"
    assert pool.alive == 0, "a rank process outlived the failure"
    leftover = [child.name for child in multiprocessing.active_children() if child.name.startswith("conformance-rank")]
    assert not leftover, f"rank processes left behind: {leftover}"
    assert not dist.is_initialized(), "the test process joined a process group"
    assert not any(_listening(port) for port in ports), "a failed process group's rendezvous store still listens"
    assert len(ports) == (2 if scenario.startswith("aborts") else 1), "a crash ran other than once more"
    assert pool.run("rank_and_size", CELL) == [(0, 2), (1, 2)], "the next cell did not get a fresh pool"
    assert len(ports) == (3 if scenario.startswith("aborts") else 2), "the next cell did not start a new process group"
    pool.stop()


def test_a_rank_that_crashes_once_is_reported_and_its_scenario_runs_again(pool: RankPool, tmp_path: Path) -> None:
    """A crash (a rank killed by a signal) that does not happen again on a fresh pool warns, quoting the rank's log."""
    try:
        with pytest.warns(ranks.RankCrashWarning, match=r"(?s)conformance-rank-1 died \(exit code -6\).*Fatal"):
            result = pool.run("aborts_once_on_rank_1", CELL, marker=str(tmp_path / "crashed"))
        assert result == [0, 1]
        assert pool.alive == 2, "the scenario's second run did not leave a working pool"
    finally:
        pool.stop()
