"""One run: one implementation on one case, alone in a fresh interpreter (``python -m bench.worker``).

The process imports torch (and nothing else of the benchmark's frameworks yet), notes its resident memory,
builds the implementation's loop (importing its framework, building the model and the optimizer), notes the
memory again, runs the untimed warm-up steps and the timed steps, and writes a JSON :class:`RunResult` with
each timed step's wall time and the process's peak resident memory (``ru_maxrss``) to the path it was given.
Nothing else runs in the process, so no other implementation's allocations or frees reach its timings.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


@dataclass(frozen=True)
class RunRequest:
    """What one run measures."""

    case: str
    impl: str
    device: str = "cpu"
    threads: int = 1
    warmup: int | None = None
    """Untimed optimizer steps; ``None``: the case's default."""
    steps: int | None = None
    """Timed optimizer steps; ``None``: the case's default."""
    profile: bool = False
    """Time nothing: run the timed steps under cProfile and return its breakdown."""


@dataclass
class RunResult:
    """What one run reports back."""

    case: str
    impl: str
    step_ns: list[int] = field(default_factory=list)
    """The wall time of each timed optimizer step (a window of the case's micro-steps)."""
    note: str = ""
    unavailable: str | None = None
    """Why the implementation cannot run here (its framework is missing); then nothing was timed."""
    rss_torch_kib: int | None = None
    """Resident memory after ``import torch``, before anything of the implementation."""
    rss_built_kib: int | None = None
    """Resident memory once the loop is built (framework imported, model and optimizer created)."""
    peak_rss_kib: int = 0
    """The process's peak resident memory at the end of the run (``getrusage(RUSAGE_SELF).ru_maxrss``)."""
    threads: int = 0
    """``torch.get_num_threads()`` after the timed steps (a framework may have changed it)."""
    cpu_fraction: float | None = None
    """The process's CPU time over the wall time of warm-up and timed steps: well under 1 (one thread) when
    other processes took the core."""
    profile: str = ""


def run(request: RunRequest) -> RunResult:
    """Measure one run in this process; call it in a fresh interpreter only."""
    import torch

    result = RunResult(request.case, request.impl, rss_torch_kib=_current_rss_kib())
    from bench.cases import TIMED_CASES
    from bench.loops import Unavailable, build_loop, quiet_frameworks

    quiet_frameworks()
    torch.set_num_threads(request.threads)
    case = TIMED_CASES[request.case]
    try:
        loop = build_loop(request.impl, case, torch.device(request.device))
    except Unavailable as exc:
        result.unavailable = str(exc)
        return result
    result.note = loop.note
    result.rss_built_kib = _current_rss_kib()
    torch.set_num_threads(request.threads)  # a framework may have changed it while setting up
    warmup = case.warmup if request.warmup is None else request.warmup
    steps = case.windows if request.steps is None else request.steps
    gc.collect()
    if request.profile:
        result.profile = _profile(loop, warmup, steps)
    else:
        wall, cpu = time.perf_counter_ns(), time.process_time_ns()
        result.step_ns = loop.time(warmup, steps)
        result.cpu_fraction = round((time.process_time_ns() - cpu) / max(1, time.perf_counter_ns() - wall), 4)
    result.threads = torch.get_num_threads()
    result.peak_rss_kib = _peak_rss_kib()
    return result


def _current_rss_kib() -> int | None:
    try:
        fields = Path("/proc/self/statm").read_text().split()
    except OSError:
        return None
    import resource

    return int(fields[1]) * resource.getpagesize() // 1024


def _peak_rss_kib() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if sys.platform == "darwin" else peak  # bytes on macOS, KiB on Linux


def _profile(loop: object, warmup: int, steps: int) -> str:
    import cProfile
    import io
    import pstats

    from bench.loops import Loop

    assert isinstance(loop, Loop)
    profiler = cProfile.Profile()
    profiler.enable()
    loop.time(warmup, steps)
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(30)
    return f"cProfile of {loop.impl}, {warmup} + {steps} steps, by own time:\n{out.getvalue()}"


def main(argv: list[str] | None = None) -> int:
    """``python -m bench.worker REQUEST_JSON RESULT_PATH``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m bench.worker REQUEST_JSON RESULT_PATH", file=sys.stderr)
        return 2
    result = run(RunRequest(**json.loads(args[0])))
    Path(args[1]).write_text(json.dumps(asdict(result)), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
