"""Python function calls per micro-step: raw PyTorch against the reference, counted with ``cProfile``.

On a small model a micro-step is a few kernels, and the wrapper's cost is the Python it runs around them: this counts
it, deterministically (a count does not depend on the machine's load, as a time does). Each case runs its loop
(:mod:`bench.loops`, the same loops ``make bench`` times) for a few warm-up windows, then counts every Python call
made in ``WINDOWS`` windows under ``cProfile`` and divides by the micro-steps. ``--top N`` prints the reference's
own functions that are called most::

    python -m bench.calls            # the table
    python -m bench.calls --top 15   # and where the reference's calls go, per case and form

The counts guard against regressions in ``tests/test_call_counts.py``; times stay with ``make bench``.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
from dataclasses import dataclass

import torch

import lightning_optimizer.reference
from bench.cases import TIMED_CASES, Case
from bench.loops import StepLoop, build_loop, quiet_frameworks

CALL_CASES = ("small-adam-32-true", "small-adam-acc4-32-true", "small-adam-16-mixed", "small-adam-acc4-16-mixed")
"""The small model (``Linear(32, 32)``, batch 8) with Adam, with and without accumulation, in 32-true and 16-mixed."""
FORMS = {"closure": "reference", "direct": "reference-direct"}
"""The reference's two call forms: ``opt.step(closure)`` and ``opt.backward(loss); opt.step()``."""
WINDOWS = 8
"""Counted windows per case (after two warm-up windows): every call form's schedule repeats within one window."""
REFERENCE_DIR = os.path.dirname(lightning_optimizer.reference.__file__) + os.sep
"""Where the reference's modules are: a call of a function defined there is one of the reference's own."""


@dataclass(frozen=True)
class Count:
    """The calls of one loop per micro-step: all of them, and those of the reference's own functions."""

    calls: float
    own: float
    profile: pstats.Stats


def count_calls(impl: str, case: Case, windows: int = WINDOWS) -> Count:
    """Profile ``windows`` windows of ``impl``'s loop on ``case`` (on the CPU) and count the calls per micro-step."""
    torch.manual_seed(0)
    loop = build_loop(impl, case, torch.device("cpu"))
    assert isinstance(loop, StepLoop), f"{impl} is not a plain loop"
    loop.time(warmup=2, steps=0)
    profiler = cProfile.Profile()
    profiler.enable()
    loop.time(warmup=0, steps=windows)
    profiler.disable()
    stats = pstats.Stats(profiler)
    micro_steps = windows * case.accumulate
    total = own = 0
    for (filename, _, _), (_, calls, *_rest) in stats.stats.items():  # type: ignore[attr-defined]
        total += calls
        if filename.startswith(REFERENCE_DIR):
            own += calls
    return Count(total / micro_steps, own / micro_steps, stats)


def _top(count: Count, micro_steps: int, n: int) -> list[str]:
    rows = []
    for (filename, line, name), (_, calls, *_rest) in count.profile.stats.items():  # type: ignore[attr-defined]
        if filename.startswith(REFERENCE_DIR):
            rows.append((calls / micro_steps, f"{filename[len(REFERENCE_DIR) :]}:{line} {name}"))
    rows.sort(reverse=True)
    return [f"    {per:6.2f}  {where}" for per, where in rows[:n]]


def main(argv: list[str] | None = None) -> None:
    """Print the table (and, with ``--top``, the reference's most-called functions)."""
    parser = argparse.ArgumentParser(prog="python -m bench.calls", description=__doc__.splitlines()[0])
    parser.add_argument("--top", type=int, default=0, help="print the reference's N most-called functions per run")
    args = parser.parse_args(argv)
    quiet_frameworks()
    torch.set_num_threads(1)
    print(f"{'case':28} {'raw':>6} " + " ".join(f"{form:>8} {'ratio':>6} {'own':>5}" for form in FORMS))
    for name in CALL_CASES:
        case = TIMED_CASES[name]
        raw = count_calls("raw", case)
        cells, tops = [], []
        for form, impl in FORMS.items():
            count = count_calls(impl, case)
            cells.append(f"{count.calls:8.1f} {count.calls / raw.calls:6.2f} {count.own:5.1f}")
            if args.top:
                tops.append(f"  {form}:")
                tops.extend(_top(count, WINDOWS * case.accumulate, args.top))
        print(f"{name:28} {raw.calls:6.1f} " + " ".join(cells))
        for line in tops:
            print(line)


if __name__ == "__main__":
    main()
