"""The benchmark's command line: ``python -m bench`` (or ``python bench/run.py``) from the repository root.

Times a training iteration of raw PyTorch, the reference (closure form and backward-then-step form), PyTorch
Lightning's wrapper, Fabric and Accelerate on a small and a mid-size model in 32-true and 16-mixed, the DDP
accumulation case on 2 gloo ranks, and optionally the conformance suite's wall time per device. Prints a table,
writes ``reports/bench.json`` and the ratio chart ``docs/bench.png``.
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

from bench.cases import ALL_CASES, DDP_CASE, IMPLEMENTATIONS, TIMED_CASES
from bench.report import Row, environment, summarise, table, write_chart, write_json
from bench.suite import REPO, SuiteTime, time_suite
from bench.timing import Settings, measure_case_in_subprocess

QUICK = {"repeats": 2, "iterations": 3, "warmup": 1, "windows": 2}


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where the timed cases run")
    parser.add_argument("--cases", help=f"comma-separated, from {', '.join(ALL_CASES)} (default: all for the device)")
    parser.add_argument("--impls", help=f"comma-separated, from {', '.join(IMPLEMENTATIONS)} (raw always runs)")
    parser.add_argument("--repeats", type=int, default=20, help="interleaved repeats per case (default 20)")
    parser.add_argument("--iterations", type=int, help="timed iterations per repeat (default: per model)")
    parser.add_argument("--warmup", type=int, help="untimed iterations first (default: per model)")
    parser.add_argument("--windows", type=int, default=8, help="timed windows per repeat in the DDP case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run: 2 repeats of 3 iterations")
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
    default_cases = list(ALL_CASES) if args.device == "cpu" else list(TIMED_CASES)
    args.cases = _choices(args.cases, ALL_CASES, "--cases") if args.cases else default_cases
    if args.device == "cuda" and DDP_CASE in args.cases:
        parser.error("the ddp case runs on gloo ranks on the CPU: leave it out with --device cuda")
    impls = _choices(args.impls, IMPLEMENTATIONS, "--impls") if args.impls else list(IMPLEMENTATIONS)
    args.impls = tuple(dict.fromkeys(["raw", *impls]))
    args.suite = [device for device in args.suite.split(",") if device]
    for name in ("repeats", "windows", "threads"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1")
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
        repeats=args.repeats,
        iterations=args.iterations,
        warmup=args.warmup,
        threads=args.threads,
        profile=args.profile,
    )
    rows: list[Row] = []
    unavailable: dict[str, str] = {}
    profiles: list[str] = []
    for case in args.cases:
        started = time.perf_counter()
        if case == DDP_CASE:
            from bench import ddp as ddp_case  # torch.distributed: imported only when asked for

            ddp = ddp_case.measure_ddp(args.repeats, args.windows, warmup=1, threads=args.threads)
            counts = {
                impl: (ddp.allreduces_per_window[impl], ddp.rounds_per_window_per_model[impl]) for impl in ddp.samples
            }
            rows += summarise(ddp_case.CASE, "cpu", ddp_case.DESCRIPTION, ddp.samples, ddp_case.NOTES, counts)
        else:
            measured = measure_case_in_subprocess(case, args.impls, settings)
            spec = TIMED_CASES[case]
            description = f"{spec.model.description}, {spec.precision}"
            rows += summarise(case, args.device, description, measured.samples, measured.notes)
            unavailable.update(measured.unavailable)
            if measured.profile:
                profiles.append(f"--- {case} ---\n{measured.profile}")
        print(f"bench: {case} measured in {time.perf_counter() - started:.1f} s", file=sys.stderr, flush=True)
    suite: list[SuiteTime] = []
    for device in args.suite:
        print(f"bench: timing the conformance suite on {device} ...", file=sys.stderr, flush=True)
        suite.append(time_suite(device))
    print(table(rows, suite, unavailable))
    for profile in profiles:
        print(profile)
    meta = {
        "generated": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m bench " + " ".join(sys.argv[1:] if argv is None else argv),
        "repeats": args.repeats,
        "quick": args.quick,
        "environment": environment(args.device, args.threads),
        "method": (
            "each case in a fresh process; after a warm-up, every repeat is a series of rounds in which each "
            "implementation, in shuffled order, runs one turn (small model: 1 untimed + 10 timed iterations; "
            "mid-size: 1 timed iteration; DDP: 1 untimed + N timed windows per repeat); median_us is the median "
            "over repeats of each repeat's median; ratio_vs_raw is the median over all rounds of the round's "
            "median divided by raw PyTorch's median in the same round; ratio_q1/ratio_q3 are the quartiles over "
            "repeats of each repeat's median round ratio"
        ),
    }
    write_json(args.json, meta, rows, suite)
    print(f"bench: wrote {args.json}", file=sys.stderr)
    if not args.no_chart and rows:
        if importlib.util.find_spec("matplotlib") is None:
            print("bench: no chart: matplotlib is not installed here", file=sys.stderr)
            return 0
        env = meta["environment"]
        where = env.get("gpu") or env["processor"]
        title = f"{args.device} ({where}), {args.threads} thread(s): median of {args.repeats} interleaved repeats"
        write_chart(args.chart, rows, title)
        print(f"bench: wrote {args.chart}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
