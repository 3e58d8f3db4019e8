"""Summaries of the samples, the terminal table, ``reports/bench.json`` and the ratio chart."""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import statistics
from dataclasses import asdict, dataclass, field
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.suite import SuiteTime

if TYPE_CHECKING:
    from bench.worker import RunResult

KIB_PER_MIB = 1024


@dataclass(frozen=True)
class Row:
    """One implementation on one case, over its runs (each a whole process).

    ``median_us`` is the median over runs of each run's median step time (a step: one optimizer step, a window
    of ``micro_steps`` micro-steps). ``ratio_vs_raw`` is the median over rounds of the run's median divided by
    raw PyTorch's in the same round (the runs of a round follow each other); ``ratio_min``/``ratio_max`` are
    the extremes of those per-round ratios. ``peak_mib`` is the median over runs of the process's peak
    resident memory, ``peak_ratio_vs_raw`` the median over rounds of its ratio to raw's, and
    ``above_torch_mib`` the median of the peak less the resident memory right after ``import torch``: what the
    implementation's framework, the model and the training add to the interpreter and torch.
    """

    case: str
    impl: str
    device: str
    description: str
    median_us: float
    ratio_vs_raw: float | None
    ratio_min: float | None
    ratio_max: float | None
    runs: int
    steps: int
    """Timed optimizer steps per run."""
    micro_steps: int
    """Micro-steps (forward and backward) per optimizer step."""
    peak_mib: float | None
    peak_ratio_vs_raw: float | None
    peak_ratio_min: float | None
    peak_ratio_max: float | None
    above_torch_mib: float | None
    note: str
    cpu_fraction_min: float | None
    """The least, over runs, of the process's CPU time over the wall time of its steps (1 thread: about 1)."""
    run_medians_us: list[float] = field(default_factory=list)
    """Each run's median step time, in the order the runs ran."""
    run_peaks_mib: list[float] = field(default_factory=list)
    collectives: str = ""
    """The collectives a window costs, on the cases of several ranks (DDP's all-reduces, FSDP's reduce-scatters)."""


def summarise(
    case: str,
    device: str,
    description: str,
    runs: dict[str, list[RunResult]],
    notes: dict[str, str],
    micro_steps: int,
    collectives: dict[str, str] | None = None,
) -> list[Row]:
    """Rows for one case from its runs; ``raw`` is the baseline of the ratios."""
    medians = {impl: [statistics.median(run.step_ns) / 1000 for run in results] for impl, results in runs.items()}
    peaks = {impl: [run.peak_rss_kib / KIB_PER_MIB for run in results] for impl, results in runs.items()}
    rows = []
    for impl, results in runs.items():
        ratio, ratio_min, ratio_max = _paired(medians[impl], medians.get("raw"))
        has_peak = all(run.peak_rss_kib for run in results)
        peak_ratio, peak_min, peak_max = _paired(peaks[impl], peaks.get("raw")) if has_peak else (None, None, None)
        above = [
            (run.peak_rss_kib - run.rss_torch_kib) / KIB_PER_MIB for run in results if run.rss_torch_kib is not None
        ]
        fractions = [run.cpu_fraction for run in results if run.cpu_fraction is not None]
        rows.append(
            Row(
                case=case,
                impl=impl,
                device=device,
                description=description,
                median_us=statistics.median(medians[impl]),
                ratio_vs_raw=ratio,
                ratio_min=ratio_min,
                ratio_max=ratio_max,
                runs=len(results),
                steps=len(results[0].step_ns),
                micro_steps=micro_steps,
                peak_mib=statistics.median(peaks[impl]) if has_peak else None,
                peak_ratio_vs_raw=peak_ratio,
                peak_ratio_min=peak_min,
                peak_ratio_max=peak_max,
                above_torch_mib=statistics.median(above) if above and has_peak else None,
                note=notes.get(impl, ""),
                cpu_fraction_min=min(fractions) if fractions else None,
                run_medians_us=[round(value, 3) for value in medians[impl]],
                run_peaks_mib=[round(value, 1) for value in peaks[impl]] if has_peak else [],
                collectives=(collectives or {}).get(impl, ""),
            )
        )
    return rows


def _paired(mine: list[float], raw: list[float] | None) -> tuple[float | None, float | None, float | None]:
    """The median, least and greatest of the ratios of run ``i`` to raw's run ``i``."""
    if raw is None or len(raw) != len(mine) or not mine:
        return None, None, None
    ratios = [value / baseline for value, baseline in zip(mine, raw, strict=True)]
    return statistics.median(ratios), min(ratios), max(ratios)


def table(rows: list[Row], suite: list[SuiteTime], unavailable: dict[str, str]) -> str:
    """The terminal table: one line per row, the notes below, the suite's wall times last."""
    header = (
        f"{'case':<26} {'impl':<22} {'per step':>10} {'x raw':>6} {'(min-max)':>12}"
        f" {'peak MiB':>9} {'x raw':>6} {'(min-max)':>12} {'>torch':>7}  collectives"
    )
    lines = [header, "-" * len(header)]
    notes: dict[str, int] = {}
    previous_case = None
    for row in rows:
        if previous_case is not None and row.case != previous_case:
            lines.append("")
        previous_case = row.case
        ratio = _number(row.ratio_vs_raw, ".3f")
        spread = "" if row.ratio_min is None else f"({row.ratio_min:.2f}-{row.ratio_max:.2f})"
        peak_spread = "" if row.peak_ratio_min is None else f"({row.peak_ratio_min:.2f}-{row.peak_ratio_max:.2f})"
        mark = notes.setdefault(f"{row.impl}: {row.note}", len(notes) + 1) if row.note else None
        impl = row.impl + (f" [{mark}]" if mark else "")
        lines.append(
            f"{row.case:<26} {impl:<22} {_duration(row.median_us):>10} {ratio:>6} {spread:>12}"
            f" {_number(row.peak_mib, '.0f'):>9} {_number(row.peak_ratio_vs_raw, '.3f'):>6} {peak_spread:>12}"
            f" {_number(row.above_torch_mib, '.0f'):>7}  {row.collectives}"
        )
    lines.append("")
    lines.append(
        "per step: median over runs (whole processes) of each run's median optimizer step (a window of the case's"
        " micro-steps); x raw: median over rounds of the ratio to raw's run of the same round (min-max over"
        " rounds); peak: ru_maxrss of the run's process; >torch: peak less the resident memory after import torch"
    )
    lines.extend(f"[{number}] {text}" for text, number in notes.items())
    lines.extend(f"not run: {what}: {why}" for what, why in unavailable.items())
    for run in suite:
        lines.append(f"conformance suite on {run.device}: {run.seconds:.1f} s (exit {run.exit_code}; {run.summary})")
    return "\n".join(lines)


def _number(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


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
    """Bars of ``ratio_vs_raw`` and of ``peak_ratio_vs_raw`` (min-max over rounds) per case; a PNG via matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in rows if row.ratio_vs_raw is not None]
    cases = list(dict.fromkeys(row.case for row in rows))
    impls = list(dict.fromkeys(row.impl for row in rows))
    colours = {impl: plt.get_cmap("tab10")(index % 10) for index, impl in enumerate(impls)}
    figure, (time_axes, memory_axes) = plt.subplots(2, 1, figsize=(max(8.0, 1.5 * len(cases) + 3.5), 8.4))
    panels = (
        (time_axes, "ratio_vs_raw", "ratio_min", "ratio_max", "time per optimizer step\n/ raw PyTorch, median"),
        (memory_axes, "peak_ratio_vs_raw", "peak_ratio_min", "peak_ratio_max", "peak resident memory\n/ raw PyTorch"),
    )
    labelled: set[str] = set()
    for axes, key, low_key, high_key, ylabel in panels:
        top = 1.0
        for index, case in enumerate(cases):
            present = [row for row in rows if row.case == case and getattr(row, key) is not None]
            for position, row in enumerate(present):
                width = 0.8 / len(present)
                ratio = float(getattr(row, key))
                low, high = getattr(row, low_key) or ratio, getattr(row, high_key) or ratio
                x = index + (position - (len(present) - 1) / 2) * width
                label = row.impl if row.impl not in labelled else None
                labelled.add(row.impl)
                spread = [[ratio - low], [high - ratio]]
                axes.bar(x, ratio, width=width, color=colours[row.impl], label=label, yerr=spread, capsize=2)
                axes.text(x, max(ratio, high), f" {ratio:.2f}", rotation=90, ha="center", va="bottom", fontsize=7)
                top = max(top, high)
        axes.axhline(1.0, color="black", linewidth=0.8)
        axes.axhline(
            1.05, color="grey", linewidth=0.8, linestyle="--", label="1.05 x raw" if axes is time_axes else None
        )
        axes.set_xticks(range(len(cases)), cases, rotation=20, ha="right", fontsize=8)
        axes.set_ylabel(ylabel)
        axes.set_ylim(0, top * 1.2 + 0.2)
    time_axes.set_title(title, fontsize=10)
    figure.legend(fontsize=8, loc="upper right")
    figure.tight_layout(rect=(0, 0, 0.86, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    plt.close(figure)
