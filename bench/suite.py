"""The conformance suite's own wall time on the reference, one device at a time (a subprocess each)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class SuiteTime:
    """One run of ``pytest conformance --impl=lightning_optimizer.reference --devices=<device>``."""

    device: str
    seconds: float
    exit_code: int
    summary: str
    """pytest's last line (counts of passed, skipped, ...)."""


def time_suite(device: str) -> SuiteTime:
    """Run the suite on ``device`` in a fresh interpreter from the repository root and time it."""
    command = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        "--impl=lightning_optimizer.reference",
        f"--devices={device}",
        "-q",
        "-p",
        "no:cacheprovider",
    ]
    env = {key: value for key, value in os.environ.items() if key != "USE_TORCH_XLA"}
    start = time.perf_counter()
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    lines = [line.strip() for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    summary = next((line for line in reversed(lines) if " in " in line and ("passed" in line or "failed" in line)), "")
    return SuiteTime(device, seconds, run.returncode, summary or (lines[-1] if lines else "no output"))
