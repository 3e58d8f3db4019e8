"""Runs of a case: one fresh process per (implementation, run), the implementations alternating.

Every run is a whole process (:mod:`bench.worker`): it imports torch, builds its implementation's loop, warms
up, times its steps and reports them with its peak memory. No two implementations ever share a process, so one
implementation's frees cannot become another's page faults, and the peak memory is the implementation's own.
Runs alternate (raw, reference, ..., accelerate, raw, reference, ...), so that drift in the machine's load
reaches every implementation alike; :func:`bench.report.summarise` pairs each run with raw PyTorch's run of
the same round.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from bench.suite import REPO
from bench.worker import RunRequest, RunResult

RUN_TIMEOUT_S = 900
"""A hang guard on each run's process, never a speed check: a ``--quick`` run's process (the benchmark's test) took
about 6 s on 2 cores beside other jobs (load 3.5), 150 times under this; ``make bench``'s runs time more steps."""


@dataclass(frozen=True)
class Settings:
    """How much to run: runs per implementation, steps per run, warm-up, threads, and an optional profile."""

    device: str = "cpu"
    runs: int = 5
    steps: int | None = None
    """Timed optimizer steps per run; ``None``: the case's default."""
    warmup: int | None = None
    threads: int = 1
    profile: str | None = None
    """An implementation to run once more per case under cProfile, for a breakdown of its time."""


@dataclass
class CaseRuns:
    """Every run of a case, per implementation, in the order they ran."""

    case: str
    runs: dict[str, list[RunResult]] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    """Implementations that did not run, and why (missing framework, or a run that failed)."""
    failed: bool = False
    """A run failed (as opposed to a framework that is not installed here)."""
    profile: str = ""


def measure_case(
    case: str, impls: tuple[str, ...], settings: Settings, progress: Callable[[str], None] | None = None
) -> CaseRuns:
    """``settings.runs`` rounds; in each, one fresh process per implementation, in the order of ``impls``."""
    result = CaseRuns(case, {impl: [] for impl in impls})
    active = list(impls)
    for index in range(settings.runs):
        for impl in list(active):
            request = RunRequest(case, impl, settings.device, settings.threads, settings.warmup, settings.steps)
            try:
                run = run_in_subprocess(request)
            except RuntimeError as exc:
                result.unavailable[impl] = f"failed in run {index + 1}: {exc}"
                result.failed = True
                active.remove(impl)
                continue
            if run.unavailable is not None:
                result.unavailable[impl] = run.unavailable
                active.remove(impl)
                continue
            result.runs[impl].append(run)
            result.notes[impl] = run.note
            if progress is not None:
                progress(f"{case} run {index + 1}/{settings.runs} {impl}")
    for impl in impls:
        # Not run, or failed after some runs: partial runs would not pair with raw's round by round.
        if not result.runs[impl] or impl not in active:
            del result.runs[impl]
    if settings.profile is not None and settings.profile in result.runs:
        request = RunRequest(case, settings.profile, settings.device, settings.threads, settings.warmup, settings.steps)
        result.profile = run_in_subprocess(RunRequest(**{**asdict(request), "profile": True})).profile
    return result


def run_in_subprocess(request: RunRequest) -> RunResult:
    """:func:`bench.worker.run` in a fresh interpreter; :class:`RuntimeError` with its error output if it fails."""
    env = dict(os.environ)
    # One thread means one thread from the start: the OpenMP and MKL pools are sized at import.
    env.update(OMP_NUM_THREADS=str(request.threads), MKL_NUM_THREADS=str(request.threads), USE_TORCH_XLA="0")
    with tempfile.TemporaryDirectory(prefix="bench-run-") as folder:
        out = Path(folder) / "result.json"
        command = [sys.executable, "-m", "bench.worker", json.dumps(asdict(request)), str(out)]
        try:
            done = subprocess.run(
                command, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"{request.impl} on {request.case} ran past {RUN_TIMEOUT_S} s") from exc
        if done.returncode != 0 or not out.is_file():
            lines = [line for line in done.stderr.splitlines() if line.strip()]
            raise RuntimeError(f"exit {done.returncode}: " + (" | ".join(lines[-3:]) or "no error output"))
        return RunResult(**json.loads(out.read_text(encoding="utf-8")))
