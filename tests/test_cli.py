"""The console script as a framework author runs it: from their own folder, under the suite's configuration."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(sys.executable).with_name("lightning-optimizer-conformance")
IMPL = "from lightning_optimizer.reference.suite_info import conformance_info as conformance_info\n"
LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST", "PYTHONPATH")

# What a caller's folder may configure for its own tests, in each file pytest reads: none of it may reach the suite.
# A hang guard, never a speed check: the longest run of the console script here took 15 s on 2 cores beside other jobs
# (load 3.5); 600 s is 40 times that.
TIMEOUT_S = 600
HOSTILE_SETTINGS = {
    "python_files": "check_*.py",
    "python_functions": "check_*",
    "filterwarnings": "error",
    "addopts": "--maxfail=1 -p no:terminal --strict-config --deselect=nothing",
}
CONFIG_FILES = {
    "pytest.ini": "[pytest]\n{lines}",
    "tox.ini": "[pytest]\n{lines}",
    "setup.cfg": "[tool:pytest]\n{lines}",
    "pyproject.toml": "[tool.pytest.ini_options]\n{toml}",
}


def run_script(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The installed console script in ``cwd``; nothing of the checkout or of this run's pytest on the path."""
    env = {key: value for key, value in os.environ.items() if key not in LEAKY_ENV}
    command = [str(SCRIPT), *args]
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


def explain(run: subprocess.CompletedProcess[str]) -> str:
    return f"exit {run.returncode}\n--- stdout\n{run.stdout[-6000:]}\n--- stderr\n{run.stderr[-3000:]}"


def hostile_folder(folder: Path, config_file: str) -> Path:
    """``folder`` with an implementation module, a conftest.py that must not load and ``config_file``."""
    (folder / "my_impl.py").write_text(IMPL, encoding="utf-8")
    (folder / "conftest.py").write_text("raise RuntimeError('the caller conftest.py was loaded')\n", encoding="utf-8")
    lines = "".join(f"{key} = {value}\n" for key, value in HOSTILE_SETTINGS.items())
    toml = "".join(f"{key} = {json.dumps(value)}\n" for key, value in HOSTILE_SETTINGS.items())
    (folder / config_file).write_text(CONFIG_FILES[config_file].format(lines=lines, toml=toml), encoding="utf-8")
    return folder


def test_the_script_is_installed() -> None:
    assert SCRIPT.is_file(), f"no console script at {SCRIPT}: is the project installed (make env)?"


# tox.ini and setup.cfg are found by the same discovery that --config-file skips: the two most common files stand
# for the four (CONFIG_FILES keeps all of them for a run by hand).
@pytest.mark.parametrize("config_file", ["pyproject.toml", "pytest.ini"])
def test_runs_the_impl_of_the_current_folder_under_the_suites_own_configuration(
    tmp_path: Path, config_file: str
) -> None:
    folder = hostile_folder(tmp_path, config_file)
    run = run_script(folder, "--impl=my_impl", "-k", "wrapper_surface", "--devices=cpu", "--precisions=32-true")
    assert run.returncode == 0, explain(run)
    configfile = next(line for line in run.stdout.splitlines() if line.startswith("configfile:"))
    assert configfile.endswith("/conformance/suite.ini"), explain(run)
    assert f"rootdir: {folder}" in run.stdout
    matrix = run.stdout[run.stdout.index("conformance matrix") :]
    assert re.search(r"^cpu/32-true/ws1\s+1\s+0\s+0\s+0\s+0\s+0$", matrix, flags=re.MULTILINE), explain(run)
    assert re.search(r"^SURFACE\s+ok$", matrix, flags=re.MULTILINE), explain(run)
    assert "1 passed" in run.stdout, explain(run)


def test_the_callers_flags_still_apply(tmp_path: Path) -> None:
    folder = hostile_folder(tmp_path, "pyproject.toml")
    report = folder / "out" / "conformance.json"
    run = run_script(
        folder,
        "--impl=my_impl",
        "-k",
        "wrapper_surface or context_surface",
        "--devices=cpu",
        "--precisions=64-true",
        "-o",
        "console_output_style=classic",
        "--report-json=out/conformance.json",
        "-W",
        "error::UserWarning",
    )
    assert run.returncode == 0, explain(run)
    document = json.loads(report.read_text(encoding="utf-8"))
    ran = {(row["check"], row["precision"]) for row in document["results"] if row["outcome"] == "passed"}
    assert ran == {("test_wrapper_surface", "64-true"), ("test_context_surface", "64-true")}, ran


def test_an_impl_that_is_not_in_the_current_folder_is_a_one_line_error(tmp_path: Path) -> None:
    run = run_script(tmp_path, "--impl=my_impl", "-k", "wrapper_surface")
    assert run.returncode == 4, explain(run)
    assert "no module named 'my_impl' can be imported" in run.stdout + run.stderr, explain(run)
    assert "Traceback" not in run.stdout + run.stderr


@pytest.mark.parametrize("missing", ["pytest", "hypothesis", "mypy"])
def test_without_the_conformance_extra_it_says_what_to_install(tmp_path: Path, missing: str) -> None:
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "from lightning_optimizer.conformance.cli import main\n"
        "raise SystemExit(main(['--impl=lightning_optimizer.reference']))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert run.returncode == 2, explain(run)
    assert missing in run.stderr
    assert "pip install 'lightning-optimizer[conformance]'" in run.stderr, explain(run)


def test_static_surface_fails_a_factory_that_cannot_take_the_suites_arguments() -> None:
    tests = Path(__file__).resolve().parent  # plugin_impls is importable from here
    run = run_script(tests, "--impl=plugin_impls.no_clip_args", "-k", "static_surface", "-p", "no:cacheprovider")
    assert run.returncode == 1, explain(run)
    assert "cannot be called as the suite calls it" in run.stdout, explain(run)
    assert "gradient_clip_val" in run.stdout
