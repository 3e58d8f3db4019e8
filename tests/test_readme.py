"""The README's examples run as written and do what the README says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from lightning_optimizer.spec import StepOutcome

README = Path(__file__).resolve().parents[1] / "README.md"
LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST", "PYTHONPATH")
# A hang guard, never a speed check: the README's suite run took 15 s and its mypy run 20 s on 2 cores beside other jobs
# (load 3.5), 32 s and 63 s with two more processes spinning beside them; 900 s is 14 times the longest.
TIMEOUT_S = 900


def test_quickstart_runs_with_the_cadences_it_describes() -> None:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    quickstart = next(block for block in blocks if "opt_gen.step(" in block)
    namespace: dict[str, Any] = {}
    exec(compile(quickstart, "README.md quickstart", "exec"), namespace)
    opt_gen, opt_dis = namespace["opt_gen"], namespace["opt_dis"]
    # 8 batches: the generator steps at batches 0, 2, 4, 6 (batch 7 leaves a window open), the discriminator at 0, 4.
    steps = {float(state["step"]) for state in opt_gen.optimizer.state.values()}
    assert steps == {4.0}, f"the generator's Adam took {steps} steps, expected 4"
    assert opt_gen.last_outcome is StepOutcome.ACCUMULATED
    assert opt_dis.last_outcome is StepOutcome.STEPPED
    assert all(p.grad is not None for p in namespace["gen"].parameters()), "batch 7's window should be open"


def test_conformance_example_type_checks_and_passes_the_suite(tmp_path: Path) -> None:
    """The README's ``my_conformance.py``, run with the README's commands in a folder of its own."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), flags=re.DOTALL)
    example = next(block for block in blocks if "def conformance_info()" in block)
    (tmp_path / "my_conformance.py").write_text(example, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key not in LEAKY_ENV}
    script = Path(sys.executable).with_name("lightning-optimizer-conformance")
    checks = "static_surface or configured_clipping or wrapper_surface"
    command = [str(script), "--impl=my_conformance", "--devices=cpu", "-k", checks, "--report-md=conformance.md"]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 0, f"exit {run.returncode}:\n{run.stdout[-6000:]}\n{run.stderr[-2000:]}"
    assert re.search(r"^SURFACE\s+ok\s+ok", run.stdout, flags=re.MULTILINE), run.stdout[-6000:]
    markdown = (tmp_path / "conformance.md").read_text(encoding="utf-8")
    assert "test_configured_clipping" in markdown and "test_static_surface" in markdown
    # The README's own mypy command, in the cache test_static_surface's run used (MYPY_CACHE_DIR, tests/conftest.py).
    mypy = [sys.executable, "-m", "mypy", "--strict", "--config-file=", "my_conformance.py"]
    typed = subprocess.run(mypy, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert typed.returncode == 0, f"mypy --strict rejects the README's example:\n{typed.stdout}{typed.stderr}"
