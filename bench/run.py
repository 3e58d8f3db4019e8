"""The benchmark's command line: ``python -m bench`` (or ``python bench/run.py``) from the repository root.

Times the optimizer steps of raw PyTorch, the reference (closure form and backward-then-step form), PyTorch
Lightning's wrapper, Fabric and Accelerate, each run a whole process of its own, on a small, a mid-size and a
25M-parameter model with SGD or Adam, with and without accumulation, in 32-true and 16-mixed; the DDP
accumulation case on 2 gloo ranks; and optionally the conformance suite's wall time per device. Prints a table
of step times and peak memory against raw PyTorch, writes ``reports/bench.json`` and the chart ``docs/bench.png``.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a script: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.cases import (
    ALL_CASES,
    DDP_CASE,
    DEFAULT_CASES,
    FSDP_CASE,
    IMPLEMENTATIONS,
    RANK_CASES,
    TIMED_CASES,
    implementations_for,
)
from bench.report import Row, environment, summarise, table, write_chart, write_json
from bench.suite import REPO, SuiteTime, time_suite
from bench.timing import Settings, measure_case

QUICK = {"runs": 2, "steps": 3, "warmup": 1}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the timed cases run")
    parser.add_argument(
        "--cases",
        help=f"comma-separated, from {', '.join(ALL_CASES)}; 'default' stands for {', '.join(DEFAULT_CASES)} "
        "(what runs without --cases), 'all' for every case (on cuda: but ddp)",
    )
    parser.add_argument("--impls", help=f"comma-separated, from {', '.join(IMPLEMENTATIONS)} (raw always runs)")
    parser.add_argument(
        "--runs", "--repeats", type=int, default=5, help="whole-process runs per implementation and case (default 5)"
    )
    parser.add_argument(
        "--steps",
        "--iterations",
        "--windows",
        dest="steps",
        type=int,
        help="timed optimizer steps per run, each a window of the case's micro-steps (default: per case)",
    )
    parser.add_argument("--warmup", type=int, help="untimed optimizer steps first (default: per case)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 runs of 1 + 3 steps")
    parser.add_argument("--suite", default="", help="devices to time the conformance suite on, e.g. cpu,xla")
    parser.add_argument("--json", type=Path, default=REPO / "reports" / "bench.json", help="the JSON report")
    parser.add_argument("--chart", type=Path, default=REPO / "docs" / "bench.png", help="the ratio chart (PNG)")
    parser.add_argument("--no-chart", action="store_true", help="write no chart")
    parser.add_argument("--profile", metavar="IMPL", help="also print a cProfile breakdown of IMPL on each case")
    args = parser.parse_args(argv)
    if args.quick:
        for name, value in QUICK.items():
            if getattr(args, name) in (None, parser.get_default(name)):
                setattr(args, name, value)
    everything = ALL_CASES if args.device == "cpu" else tuple(case for case in ALL_CASES if case not in RANK_CASES)
    groups = {"all": everything, "default": DEFAULT_CASES}
    chosen = _choices(args.cases or "default", (*groups, *ALL_CASES), "--cases")
    args.cases = list(dict.fromkeys(case for item in chosen for case in groups.get(item, (item,))))
    if args.device == "cuda" and set(RANK_CASES) & set(args.cases):
        parser.error("the ddp and fsdp cases run on gloo ranks on the CPU: leave them out with --device cuda")
    impls = _choices(args.impls, IMPLEMENTATIONS, "--impls") if args.impls else list(IMPLEMENTATIONS)
    args.impls = tuple(dict.fromkeys(["raw", *impls]))
    args.suite = [device for device in args.suite.split(",") if device]
    for name in ("runs", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
    for name in ("steps", "warmup"):
        if getattr(args, name) is not None and getattr(args, name) < (1 if name == "steps" else 0):
            parser.error(f"--{name} is too small")
    return args


def _choices(text: str, allowed: tuple[str, ...], flag: str) -> list[str]:
    chosen = [item.strip() for item in text.split(",") if item.strip()]
    unknown = [item for item in chosen if item not in allowed]
    if unknown:
        raise SystemExit(f"{flag}: unknown {', '.join(unknown)}; expected some of {', '.join(allowed)}")
    return chosen


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    settings = Settings(
        device=args.device,
        runs=args.runs,
        steps=args.steps,
        warmup=args.warmup,
        threads=args.threads,
        profile=args.profile,
    )
    rows: list[Row] = []
    unavailable: dict[str, str] = {}
    profiles: list[str] = []
    failed = False
    begun = time.perf_counter()

    def progress(what: str) -> None:
        print(f"bench: {time.perf_counter() - begun:7.1f} s  {what}", file=sys.stderr, flush=True)

    for case in args.cases:
        started = time.perf_counter()
        if case == DDP_CASE:
            from bench import ddp as ddp_case  # torch.distributed: imported only when asked for

            ddp = ddp_case.measure_ddp(
                args.runs, args.steps or ddp_case.WINDOWS, warmup=1, threads=args.threads, progress=progress
            )
            counts = {
                impl: f"{ddp.allreduces_per_window[impl]:g} all-reduces ({ddp.rounds_per_window_per_model[impl]:g} "
                "round/model) per window"
                for impl in ddp.runs
            }
            rows += summarise(
                ddp_case.CASE, "cpu", ddp_case.DESCRIPTION, ddp.runs, ddp_case.NOTES, ddp_case.ACCUMULATE, counts
            )
        elif case == FSDP_CASE:
            from bench import fsdp as fsdp_case

            fsdp, counts = fsdp_case.measure_fsdp(
                args.runs, args.steps or fsdp_case.WINDOWS, warmup=1, threads=args.threads, progress=progress
            )
            rows += summarise(
                fsdp_case.CASE, "cpu", fsdp_case.DESCRIPTION, fsdp.runs, fsdp_case.NOTES, fsdp_case.ACCUMULATE, counts
            )
        else:
            spec = TIMED_CASES[case]
            measured = measure_case(case, implementations_for(spec, args.impls), settings, progress)
            rows += summarise(case, args.device, spec.description, measured.runs, measured.notes, spec.accumulate)
            unavailable.update({f"{impl} on {case}": why for impl, why in measured.unavailable.items()})
            failed = failed or measured.failed
            if measured.profile:
                profiles.append(f"--- {case} ---\n{measured.profile}")
        print(f"bench: {case} measured in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    suite: list[SuiteTime] = []
    for device in args.suite:
        print(f"bench: timing the conformance suite on {device} ...", file=sys.stderr, flush=True)
        suite.append(time_suite(device))
    print(table(rows, suite, _shortened(unavailable)))
    busy = [f"{row.case} {row.impl} ({row.cpu_fraction_min:.2f})" for row in rows if (row.cpu_fraction_min or 1) < 0.9]
    if busy:
        print(f"bench: other processes took the core during some runs (CPU/wall time): {', '.join(busy)}")
    for profile in profiles:
        print(profile)
    meta = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "runs": args.runs,
        "quick": args.quick,
        "seconds": round(time.perf_counter() - begun, 1),
        "environment": environment(args.device, args.threads),
        "unavailable": unavailable,
        "method": (
            "every run is a fresh process (python -m bench.worker) that imports torch, builds one "
            "implementation's loop, runs the case's untimed warm-up steps, times each of its steps (a step: one "
            "optimizer step, a window of the case's micro-steps) and reports ru_maxrss; in each round every "
            "implementation runs once, in a fixed order starting with raw PyTorch; median_us is the median over "
            "runs of each run's median step; ratio_vs_raw is the median over rounds of the run's median divided "
            "by raw's in the same round, ratio_min/ratio_max the extremes of those ratios; peak_mib and "
            "peak_ratio_vs_raw likewise for the peak resident memory; above_torch_mib is the peak less the "
            "resident memory right after import torch. DDP: per round and implementation a fresh pool of rank "
            "processes; the times and the peak are rank 0's"
        ),
    }
    write_json(args.json, meta, rows, suite)
    print(f"bench: wrote {args.json}", file=sys.stderr)
    if not args.no_chart and rows:
        if importlib.util.find_spec("matplotlib") is None:
            print("bench: no chart: matplotlib is not installed here", file=sys.stderr)
            return 1 if failed else 0
        env = meta["environment"]
        where = env.get("gpu") or env["processor"]
        title = f"{args.device} ({where}), {args.threads} thread(s): median of {args.runs} whole-process runs"
        write_chart(args.chart, rows, title)
        print(f"bench: wrote {args.chart}", file=sys.stderr)
    return 1 if failed else 0


def _shortened(unavailable: dict[str, str]) -> dict[str, str]:
    """The reasons for the table: a missing framework once, not once per case."""
    reasons: dict[str, list[str]] = {}
    for what, why in unavailable.items():
        reasons.setdefault(why, []).append(what)
    shortened = {}
    for why, whats in reasons.items():
        impls = list(dict.fromkeys(what.split(" on ")[0] for what in whats))
        key = whats[0] if len(whats) == 1 else f"{', '.join(impls)} on {len(whats)} cases"
        shortened[key] = why
    return shortened


if __name__ == "__main__":
    raise SystemExit(main())
