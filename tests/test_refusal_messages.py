"""A check whose call is not refused says which call should have raised, and which rule says so.

The suite runs against a mutant that accepts what the contract refuses (``mutants.err.second_context_may_wrap``: a
second live context may wrap an optimizer that the first wraps, ERR-010). The failure, in pytest's output and in
the report's reason, names the call and the requirement rather than only pytest's ``DID NOT RAISE``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")

# A hang guard, never a speed check: the suite run here took 13 s on 2 cores beside other jobs (load 3.5); 600 s is 46
# times that.
TIMEOUT_S = 600
MUTANT = "mutants.err.second_context_may_wrap"
CHECK = "test_wrap_of_an_optimizer_another_context_wraps"
CALL = "second.wrap(optimizer) of an optimizer that a first, live context wraps"
MESSAGE = f"{CALL} did not raise ValueError (ERR-010: "


def test_unrefused_call_names_the_call_and_the_requirement(tmp_path: Path) -> None:
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    report = tmp_path / "report.json"
    command = [
        sys.executable,
        "-m",
        "pytest",
        "conformance",
        f"--impl={MUTANT}",
        "--devices=cpu",
        "--precisions=32-true",
        "--world-sizes=1",
        "-k",
        CHECK,
        f"--report-json={report}",
        f"--basetemp={tmp_path / 'tmp'}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    run = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    output = run.stdout + run.stderr
    assert run.returncode == 1, f"exit {run.returncode}, expected 1 (the check fails)\n{output[-6000:]}"
    assert MESSAGE in output, f"the failure does not name the call and its requirement:\n{output[-6000:]}"
    assert "DID NOT RAISE" not in output, f"the failure still reads as pytest's bare DID NOT RAISE:\n{output[-6000:]}"
    rows = [row for row in json.loads(report.read_text(encoding="utf-8"))["results"] if row["check"] == CHECK]
    assert [row["outcome"] for row in rows] == ["failed"], rows
    assert rows[0]["reason"].startswith(f"Failed: {MESSAGE}"), rows[0]["reason"]
