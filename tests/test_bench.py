"""The benchmark's smoke run: ``python -m bench --quick`` times, prints its table and writes the report and chart.

Speed is measured by ``make bench``, not asserted here: the checks are on the report's shape and sanity.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CASES = ("small-16-mixed", "small-adam-acc4-32-true")
IMPLS = ("raw", "reference", "reference-restore")
# A hang guard, never a speed check: the quick run took 63 s (the other run 6 s) on 2 cores beside other jobs (load
# 3.5), 175 s with two more processes spinning beside it, and more than 240 s once under a load of 10 on 2 cores;
# 1200 s is 5 times the last.
TIMEOUT_S = 1200


def test_quick_run_writes_the_report_and_the_chart(tmp_path: Path) -> None:
    report, chart = tmp_path / "bench.json", tmp_path / "bench.png"
    command = [sys.executable, "-m", "bench", "--quick", "--cases", ",".join(CASES), "--impls", ",".join(IMPLS)]
    command += ["--json", str(report), "--chart", str(chart)]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    rows = json.loads(report.read_text(encoding="utf-8"))["rows"]
    # The restore loops run only where a window spans several micro-steps (the only place their price is paid).
    expected = [(c, i) for c in CASES for i in IMPLS if "acc" in c or not i.endswith("-restore")]
    assert sorted((row["case"], row["impl"]) for row in rows) == sorted(expected)
    for row in rows:
        # --quick: 2 runs (each a process of its own) of 3 timed optimizer steps
        assert row["runs"] == 2 and row["steps"] == 3, row
        assert len(row["run_medians_us"]) == 2 and len(row["run_peaks_mib"]) == 2, row
        assert row["micro_steps"] == (4 if "acc4" in row["case"] else 1), row
        # A step takes some time, never nothing; no upper bound: a loaded machine may stretch a step without limit.
        assert math.isfinite(row["median_us"]) and row["median_us"] > 1.0, row
        assert math.isfinite(row["ratio_vs_raw"]) and row["ratio_vs_raw"] > 0, row
        assert row["ratio_min"] <= row["ratio_vs_raw"] <= row["ratio_max"], row
        # Each run's peak is its own process's: the interpreter and torch, some hundreds of MiB.
        assert 50 < row["peak_mib"] < 10_000 and row["above_torch_mib"] >= 0, row
        assert math.isfinite(row["peak_ratio_vs_raw"]) and row["peak_ratio_vs_raw"] > 0, row
        if row["impl"] == "raw":
            assert row["ratio_vs_raw"] == 1.0 and row["peak_ratio_vs_raw"] == 1.0, row
    notes = {(row["case"], row["impl"]): row["note"] for row in rows}
    assert notes["small-16-mixed", "raw"] == "hand-written GradScaler loop", notes
    assert "loss / 4" in notes["small-adam-acc4-32-true", "raw"], notes
    assert "accumulate_grad_batches=4" in notes["small-adam-acc4-32-true", "reference"], notes
    assert "on_failure='restore'" in notes["small-adam-acc4-32-true", "reference-restore"], notes

    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "the chart is not a PNG"
    table = run.stdout.splitlines()
    for case in CASES:
        assert any(line.startswith(case) and "reference" in line for line in table), run.stdout


def test_the_raw_accumulation_loop_computes_what_the_reference_does() -> None:
    # The same weights after 2 steps of 4 micro-steps: loss / 4 per micro-step is the reference's window mean (also
    # with zero_grad_after_step=False and zero_grad() at each window's start, as Lightning's automatic loop).
    script = """
import torch
from bench.cases import TIMED_CASES
from bench.loops import build_loop
case = TIMED_CASES["small-adam-acc4-32-true"]
models = {}
impls = ("reference", "reference-direct", "reference-restore", "reference-direct-restore", "reference-user-zero")
for impl in ("raw", *impls):
    loop = build_loop(impl, case, torch.device("cpu"))
    loop.time(1, 1)
    models[impl] = dict(loop.model.named_parameters())
for impl in impls:
    for name, param in models["raw"].items():
        torch.testing.assert_close(models[impl][name], param, rtol=1e-5, atol=1e-6)
print("same")
"""
    run = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0 and run.stdout.strip().endswith("same"), run.stdout[-2000:] + run.stderr[-2000:]
