"""Summaries of the samples, the terminal table, ``reports/bench.json`` and the ratio chart."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass
from importlib import metadata
from itertools import chain
from pathlib import Path
from typing import Any

from bench.suite import SuiteTime

Samples = dict[str, list[list[list[int]]]]
"""Per implementation, per repeat, per round: the wall time (ns) of each timed iteration of its turn."""


@dataclass(frozen=True)
class Row:
    """One implementation on one case.

    ``median_us`` is the median over repeats of each repeat's median iteration (or window) time.
    ``ratio_vs_raw`` is the median over all rounds of the implementation's median in the round divided by raw
    PyTorch's in the same round: the turns of a round run within milliseconds of each other, so the ratio
    cancels drift in the machine's load. ``ratio_q1``/``ratio_q3`` are the quartiles, over repeats, of each
    repeat's median round ratio.
    """

    case: str
    impl: str
    device: str
    description: str
    median_us: float
    ratio_vs_raw: float | None
    ratio_q1: float | None
    ratio_q3: float | None
    repeats: int
    iterations: int
    """Timed iterations (or windows) per repeat."""
    note: str
    allreduces_per_window: float | None = None
    rounds_per_window_per_model: float | None = None


def summarise(
    case: str,
    device: str,
    description: str,
    samples: Samples,
    notes: dict[str, str],
    counts: dict[str, tuple[float, float]] | None = None,
) -> list[Row]:
    """Rows for one case from its samples; ``raw`` is the baseline of the ratios."""
    round_medians = {
        impl: [[statistics.median(turn) for turn in repeat] for repeat in repeats] for impl, repeats in samples.items()
    }
    baseline = round_medians.get("raw")
    rows = []
    for impl, repeats in samples.items():
        ratios = None
        if baseline is not None:
            ratios = [
                [mine / raw for mine, raw in zip(rounds, raw_rounds, strict=True)]
                for rounds, raw_rounds in zip(round_medians[impl], baseline, strict=True)
            ]
        q1, q3 = _quartiles([statistics.median(repeat) for repeat in ratios]) if ratios else (None, None)
        allreduces, sync_rounds = counts[impl] if counts else (None, None)
        repeat_medians = [statistics.median(chain.from_iterable(repeat)) for repeat in repeats]
        rows.append(
            Row(
                case=case,
                impl=impl,
                device=device,
                description=description,
                median_us=statistics.median(repeat_medians) / 1000,
                ratio_vs_raw=statistics.median(chain.from_iterable(ratios)) if ratios else None,
                ratio_q1=q1,
                ratio_q3=q3,
                repeats=len(repeats),
                iterations=sum(len(turn) for turn in repeats[0]) if repeats else 0,
                note=notes.get(impl, ""),
                allreduces_per_window=allreduces,
                rounds_per_window_per_model=sync_rounds,
            )
        )
    return rows


def _quartiles(values: list[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def table(rows: list[Row], suite: list[SuiteTime], unavailable: dict[str, str]) -> str:
    """The terminal table: one line per row, the notes below, the suite's wall times last."""
    header = f"{'case':<18} {'impl':<24} {'median':>11} {'x raw':>6} {'(IQR)':>13}  all-reduces/window"
    lines = [header, "-" * len(header)]
    notes: dict[str, int] = {}
    previous_case = None
    for row in rows:
        if previous_case is not None and row.case != previous_case:
            lines.append("")
        previous_case = row.case
        ratio = "" if row.ratio_vs_raw is None else f"{row.ratio_vs_raw:.3f}"
        spread = "" if row.ratio_q1 is None else f"({row.ratio_q1:.2f}-{row.ratio_q3:.2f})"
        reduces = (
            ""
            if row.allreduces_per_window is None
            else (f"{row.allreduces_per_window:g} ({row.rounds_per_window_per_model:g} round/model)")
        )
        mark = notes.setdefault(f"{row.impl}: {row.note}", len(notes) + 1) if row.note else None
        impl = row.impl + (f" [{mark}]" if mark else "")
        lines.append(f"{row.case:<18} {impl:<24} {_duration(row.median_us):>11} {ratio:>6} {spread:>13}  {reduces}")
    lines.append("")
    lines.extend(f"[{number}] {text}" for text, number in notes.items())
    lines.extend(f"not run: {impl}: {why}" for impl, why in unavailable.items())
    for run in suite:
        lines.append(f"conformance suite on {run.device}: {run.seconds:.1f} s (exit {run.exit_code}; {run.summary})")
    return "\n".join(lines)


def _duration(microseconds: float) -> str:
    return f"{microseconds / 1000:.2f} ms" if microseconds >= 10_000 else f"{microseconds:.1f} us"


def environment(device: str, threads: int) -> dict[str, Any]:
    """Versions and the machine, for the JSON report."""
    versions: dict[str, str | None] = {}
    for package in ("torch", "pytorch-lightning", "accelerate"):
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            versions[package] = None
    versions["lightning_fabric"] = _fabric_version()
    env: dict[str, Any] = {
        "device": device,
        "threads": threads,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "processor": _processor(),
        "cpu_count": os.cpu_count(),
        "versions": versions,
    }
    if device == "cuda":
        import torch

        if torch.cuda.is_available():
            env["gpu"] = torch.cuda.get_device_name(0)
            env["cuda"] = torch.version.cuda
    return env


def _fabric_version() -> str | None:
    # lightning_fabric ships inside the pytorch-lightning wheel, with its version in a file beside it.
    spec = importlib.util.find_spec("lightning_fabric")
    if spec is None or spec.origin is None:
        return None
    info = Path(spec.origin).parent / "version.info"
    return info.read_text(encoding="utf-8").strip() if info.is_file() else None


def _processor() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def write_json(path: Path, meta: dict[str, Any], rows: list[Row], suite: list[SuiteTime]) -> None:
    """``{"meta": ..., "rows": [...], "suite": [...]}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {"meta": meta, "rows": [asdict(row) for row in rows], "suite": [asdict(run) for run in suite]}
    path.write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")


def write_chart(path: Path, rows: list[Row], title: str) -> None:
    """Bars of ``ratio_vs_raw`` (with the IQR over repeats) per case and implementation; a PNG via matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in rows if row.ratio_vs_raw is not None]
    cases = list(dict.fromkeys(row.case for row in rows))
    impls = list(dict.fromkeys(row.impl for row in rows))
    colours = {impl: plt.get_cmap("tab10")(index % 10) for index, impl in enumerate(impls)}
    figure, axes = plt.subplots(figsize=(max(8.0, 1.7 * len(cases) + 3.5), 4.8))
    labelled: set[str] = set()
    for index, case in enumerate(cases):
        present = [row for row in rows if row.case == case]
        width = 0.8 / len(present)
        for position, row in enumerate(present):
            ratio = row.ratio_vs_raw or 0.0
            x = index + (position - (len(present) - 1) / 2) * width
            spread = [[ratio - (row.ratio_q1 or ratio)], [(row.ratio_q3 or ratio) - ratio]]
            label = row.impl if row.impl not in labelled else None
            labelled.add(row.impl)
            axes.bar(x, ratio, width=width, color=colours[row.impl], label=label, yerr=spread, capsize=2)
            above = max(ratio, row.ratio_q3 or ratio)
            axes.text(x, above, f" {ratio:.2f}", rotation=90, ha="center", va="bottom", fontsize=7)
    axes.axhline(1.0, color="black", linewidth=0.8)
    axes.axhline(1.05, color="grey", linewidth=0.8, linestyle="--", label="1.05 x raw")
    axes.set_xticks(range(len(cases)), cases)
    axes.set_ylabel("time per iteration (DDP: per window)\n/ raw PyTorch, median")
    axes.set_title(title, fontsize=10)
    top = max((row.ratio_q3 or row.ratio_vs_raw or 0.0 for row in rows), default=1.0)
    axes.set_ylim(0, top * 1.2 + 0.2)
    axes.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
