"""A second implementation, written from the spec alone, passes the whole suite: the suite checks the contract.

``tests/independent`` (importable as ``independent`` with ``PYTHONPATH=<repo>/tests``) shares no code with the
reference. The real suite runs against it on every CPU cell (five precisions, world sizes 1 and 2): no check may
fail, err or deviate, and a check may be ``n/a`` only where its own cell markers exclude the cell, never for a
missing claim. As its claims cover the reference's, every check that the reference passes on these cells runs
and passes here too (that the reference passes them is checked by ``test_mutants.py`` and ``make conformance``).
Its XLA claim is checked the same way when ``INDEPENDENT_XLA=1``: the XLA cells take minutes, so run them after
changing the package.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from lightning_optimizer.reference import conformance_info as reference_info
from lightning_optimizer.spec import FEATURES, PRECISIONS

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
PACKAGE = TESTS / "independent"
TIMEOUT_S = 1200
WITH_XLA = os.environ.get("INDEPENDENT_XLA") == "1"
HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
MIN_PASSES = {"cpu": 280, "xla": 250}
"""Passed checks and cells today: 301 on the CPU cells, 279 on the XLA ones; far fewer means checks went missing."""
STATIC_NA = "the check does not apply to "
"""How an ``n/a`` that comes from a check's own cell markers begins (the same for every implementation)."""
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")
_ALLOWED_IMPORTS = ("torch", "torch_xla", "lightning_optimizer.spec", "independent")


@dataclass(frozen=True)
class Run:
    """One finished session of the suite against the independent implementation, with its JSON report."""

    devices: str
    exit: int | None
    output: str
    document: dict[str, Any] | None

    def explain(self) -> str:
        return f"--devices={self.devices}: exit {self.exit}\n--- output (tail)\n{self.output[-6000:]}"

    @property
    def results(self) -> list[dict[str, Any]]:
        assert self.document is not None, self.explain()
        rows: list[dict[str, Any]] = self.document["results"]
        return rows


def _cell(row: dict[str, Any]) -> str:
    return "any" if row["device"] is None else f"{row['device']}/{row['precision']}/ws{row['world_size']}"


def _run(devices: str, out: Path) -> Run:
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(TESTS), env.get("PYTHONPATH")]))
    command = [
        *(sys.executable, "-m", "pytest", "conformance", "--impl=independent", f"--devices={devices}"),
        "--world-sizes=1,2",
        f"--report-json={out / 'report.json'}",
        f"--basetemp={out / 'tmp'}",
        f"--override-ini=cache_dir={out / 'cache'}",
        "-q",
    ]
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as exc:
        code, output = None, f"the suite ran past {TIMEOUT_S} s: {exc}"
    report = out / "report.json"
    document = json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None
    return Run(devices, code, output, document)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The suite against the independent implementation on every CPU cell."""
    return _run("cpu", tmp_path_factory.mktemp("independent-cpu"))


@pytest.fixture(scope="module")
def xla_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The same on every XLA cell (several minutes): only with ``INDEPENDENT_XLA=1`` and torch_xla here."""
    if not WITH_XLA:
        pytest.skip("the XLA cells take minutes: set INDEPENDENT_XLA=1 to run them")
    if not HAS_TORCH_XLA:
        pytest.skip("unavailable here: torch_xla is not installed")
    return _run("xla", tmp_path_factory.mktemp("independent-xla"))


def _assert_conforms(run: Run) -> None:
    """Exit 0; nothing failed, erred or deviated; ``n/a`` only where the check's markers exclude the cell, or FSDP."""
    assert run.document is not None and run.exit == 0, run.explain()
    bad = [
        f"{row['check']} on {_cell(row)}: {row['outcome']} ({row['reason']})"
        for row in run.results
        if row["outcome"] not in ("passed", "n/a", "unavailable")
        or (row["outcome"] == "n/a" and not row["reason"].startswith(STATIC_NA) and row["strategy"] != "fsdp")
    ]
    assert not bad, "the independent implementation does not pass every check it could run:\n" + "\n".join(bad)
    passes = run.document["summary"]["passed"]
    assert passes >= MIN_PASSES[run.devices], f"only {passes} checks and cells passed:\n{run.explain()}"
    passed_cells = {_cell(row) for row in run.results if row["outcome"] == "passed"}
    cells = {f"{run.devices}/{precision}/ws{world}" for precision in PRECISIONS for world in (1, 2)}
    if run.devices == "xla":
        cells = {cell for cell in cells if cell.endswith("ws1")}  # XLA replicas are not DDP ranks
    assert cells <= passed_cells, f"cells where no check passed: {sorted(cells - passed_cells)}"


def test_claims_cover_the_reference(cpu_run: Run) -> None:
    """Claims at least the reference's on CPU and XLA but FSDP, so every other check the reference passes runs here."""
    assert cpu_run.document is not None, cpu_run.explain()
    claims = cpu_run.document["claims"]
    assert claims == {
        "devices": ["cpu", "xla"],
        "precisions": sorted(PRECISIONS),
        "world_sizes": [1, 2],
        "strategies": ["ddp", "none", "spmd"],
        "features": sorted(FEATURES),
    }
    reference = reference_info()
    assert reference.devices - {"cuda"} <= set(claims["devices"])
    assert reference.precisions <= set(claims["precisions"])
    assert reference.world_sizes <= set(claims["world_sizes"])
    assert reference.features <= set(claims["features"])
    # It was written before contract 2026.12.4 and does not shard: the FSDP cells are the reference's alone.
    assert reference.strategies - set(claims["strategies"]) == {"fsdp"}


def test_passes_every_cpu_check(cpu_run: Run) -> None:
    _assert_conforms(cpu_run)


def test_passes_every_xla_check(xla_run: Run) -> None:
    _assert_conforms(xla_run)


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


def test_shares_no_code_with_the_reference() -> None:
    """Only torch (and torch_xla), the spec and the standard library: nothing of the reference or the suite."""
    sources = sorted(PACKAGE.glob("*.py"))
    assert sources, f"no modules in {PACKAGE}"
    foreign = {
        f"{path.name}: {name}"
        for path in sources
        for name in _imports(path)
        if name.split(".")[0] not in sys.stdlib_module_names
        and not any(name == allowed or name.startswith(allowed + ".") for allowed in _ALLOWED_IMPORTS)
    }
    assert not foreign, f"imports outside torch, the spec and the standard library: {sorted(foreign)}"
