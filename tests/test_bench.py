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
CASES = ("small-16-mixed",)
IMPLS = ("raw", "reference", "reference-direct")


def test_quick_run_writes_the_report_and_the_chart(tmp_path: Path) -> None:
    report, chart = tmp_path / "bench.json", tmp_path / "bench.png"
    command = [sys.executable, "-m", "bench", "--quick", "--cases", ",".join(CASES), "--impls", ",".join(IMPLS)]
    command += ["--json", str(report), "--chart", str(chart)]
    run = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]

    rows = json.loads(report.read_text(encoding="utf-8"))["rows"]
    assert sorted((row["case"], row["impl"]) for row in rows) == sorted((c, i) for c in CASES for i in IMPLS)
    for row in rows:
        assert {"case", "impl", "median_us", "ratio_vs_raw", "repeats"} <= row.keys(), row
        assert row["repeats"] == 2 and row["iterations"] == 3, row  # --quick: 2 repeats of 3 iterations
        # An iteration of Linear(32, 32) on a batch of 8 takes microseconds to milliseconds, never nothing.
        assert 1.0 < row["median_us"] < 1e6, row
        assert math.isfinite(row["ratio_vs_raw"]) and row["ratio_vs_raw"] > 0, row
        if row["impl"] == "raw":
            assert row["ratio_vs_raw"] == 1.0, row
    raw_note = next(row["note"] for row in rows if row["impl"] == "raw")
    assert raw_note == "hand-written GradScaler loop", raw_note

    assert chart.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", "the chart is not a PNG"
    table = run.stdout.splitlines()
    for case in CASES:
        assert any(line.startswith(case) and "reference-direct" in line for line in table), run.stdout
