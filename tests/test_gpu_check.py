"""The GPU check script works from a bare working tree (the package through its own links), then benchmarks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A hang guard, never a speed check: the script (a suite run and the benchmark's smoke run) took 27 s on 2 cores beside
# other jobs (load 3.5); 900 s is 33 times that.
TIMEOUT_S = 900


def test_gpu_check_runs_the_suite_from_the_working_tree(tmp_path: Path) -> None:
    # The benchmark's smoke run (one process per implementation) stands in for the GPU's 10 repeats of the small
    # and mid-size cases; tests/test_bench.py checks the smoke run's repeats themselves.
    bench = "--quick --runs 1 --impls raw,reference --cases small-32-true"
    env = dict(os.environ, PYTHON=sys.executable, GPU_CHECK_DEVICES="cpu", GPU_CHECK_BENCH_ARGS=bench)
    command = ["bash", str(REPO / "scripts" / "gpu-check"), str(tmp_path), "-k", "wrapper_surface"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, run.stdout[-4000:] + run.stderr[-2000:]
    header = next(line for line in run.stdout.splitlines() if line.startswith("gpu-check:"))
    assert header.endswith("lightning_optimizer/reference/__init__.py"), header
    assert "__editable__" not in header and "site-packages" not in header, "the script did not use its own links"
    assert "conformance matrix" in run.stdout
    document = json.loads((tmp_path / "gpu-conformance.json").read_text())
    cells = {(r["device"], r["precision"], r["world_size"]) for r in document["results"]}
    assert cells == {("cpu", "32-true", 1), ("cpu", "16-mixed", 1), ("cpu", "bf16-mixed", 1)}
    assert all(r["outcome"] == "passed" for r in document["results"]), document["results"]
    bench_rows = json.loads((tmp_path / "gpu-bench.json").read_text())["rows"]
    assert {(r["case"], r["impl"], r["device"]) for r in bench_rows} == {
        ("small-32-true", "raw", "cpu"),
        ("small-32-true", "reference", "cpu"),
    }
    assert (tmp_path / "gpu-bench.png").read_bytes()[:4] == b"\x89PNG"
    assert any(line.startswith("small-32-true") for line in run.stdout.splitlines()), "no benchmark table"
