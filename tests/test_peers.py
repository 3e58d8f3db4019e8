"""The peer adapters load as implementations and stay faithful; ``scripts/peers`` renders the comparison page.

One subprocess (``plugin_impls.run_many``: torch and the peers imported once) runs a few cpu/32-true checks
against each adapter. Each must pass the basic checks, and each must report one failure that the research
documents for its peer with a reproducing script, with the peer's own message: an adapter that smoothed the
peer's behaviour over would pass it instead.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]
ADAPTERS = ("lightning", "fabric", "accelerate")
BASIC_CHECKS = ("test_wrapper_surface", "test_context_surface", "test_proxied_objects_are_the_inner_ones")
KNOWN_DEVIATIONS = {
    # adapter: (check, words of the peer's own failure)
    "lightning": ("test_writes_reach_the_inner_optimizer", "load_state_dict did not reach the inner optimizer"),
    "fabric": ("test_kwargs_reach_the_inner_step", "unexpected keyword argument 'scale'"),
    "accelerate": ("test_step_hooks_fire_on_real_steps", "'AcceleratedOptimizer' object has no attribute"),
}
# A hang guard, never a speed check: the adapters' suite runs took 23 s on 2 cores beside other jobs (load 3.5); 600 s
# is 26 times that.
TIMEOUT_S = 600
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")


@pytest.fixture(scope="module")
def adapter_reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """Each adapter's JSON report over the basic checks and its known deviation, cpu/32-true/ws1."""
    folder = tmp_path_factory.mktemp("peers")
    cases = {}
    for adapter in ADAPTERS:
        checks = " or ".join([*BASIC_CHECKS, KNOWN_DEVIATIONS[adapter][0]])
        args = [f"--impl=lightning_optimizer.peers.{adapter}", "--devices=cpu", "--precisions=32-true"]
        args += ["--world-sizes=1", "-k", checks, f"--report-json={folder / adapter}.json", "-q"]
        cases[adapter] = {"args": args}
    (folder / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    env["USE_TORCH_XLA"] = "0"  # Accelerate would otherwise run in its XLA mode on the CPU cells
    command = [sys.executable, "-m", "plugin_impls.run_many", str(folder / "cases.json"), str(folder / "out.json")]
    completed = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert completed.returncode == 0, completed.stderr[-3000:]
    runs = json.loads((folder / "out.json").read_text(encoding="utf-8"))
    reports = {}
    for adapter in ADAPTERS:
        path = folder / f"{adapter}.json"
        run = runs[adapter]
        assert path.is_file(), f"{adapter}: no report\n{run['stdout'][-3000:]}{run['stderr'][-2000:]}"
        reports[adapter] = json.loads(path.read_text(encoding="utf-8"))
    return reports


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_adapter_passes_the_basic_checks(adapter_reports: dict[str, dict[str, Any]], adapter: str) -> None:
    document = adapter_reports[adapter]
    assert document["impl"]["module"] == f"lightning_optimizer.peers.{adapter}"
    assert "cpu" in document["claims"]["devices"] and "32-true" in document["claims"]["precisions"]
    outcomes = {row["check"]: (row["outcome"], row["reason"]) for row in document["results"]}
    for check in BASIC_CHECKS:
        assert outcomes.get(check, ("missing", ""))[0] == "passed", f"{adapter} {check}: {outcomes.get(check)}"


@pytest.mark.parametrize("adapter", ADAPTERS)
def test_adapter_lets_the_peers_own_behaviour_through(adapter_reports: dict[str, dict[str, Any]], adapter: str) -> None:
    check, words = KNOWN_DEVIATIONS[adapter]
    rows = [row for row in adapter_reports[adapter]["results"] if row["check"] == check]
    assert len(rows) == 1, f"{adapter}: {check} did not run once: {rows}"
    assert rows[0]["outcome"] == "failed", f"{adapter} {check}: {rows[0]}"
    assert words in rows[0]["reason"], f"{adapter} {check}: {rows[0]['reason'][:500]}"


# -- the page ------------------------------------------------------------------------------------------------


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("peers_script", str(REPO / "scripts" / "peers"))
    spec = importlib.util.spec_from_loader("peers_script", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up while they are built
    loader.exec_module(module)
    return module


def _row(check: str, cell: str | None, outcome: str, reason: str = "", reqs: tuple[str, ...] = ("STEP-001",)) -> Any:
    device, precision, world = cell.split("/") if cell else (None, None, None)
    return {
        "check": check,
        "requirements": list(reqs),
        "device": device,
        "precision": precision,
        "world_size": None if world is None else int(world.removeprefix("ws")),
        "outcome": outcome,
        "reason": reason,
        "duration_s": 0.1,
    }


def _document(name: str, module: str, rows: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "schema_version": 1,
        "contract_version": "2026.11",
        "impl": {"name": name, "module": module, "version": "9.9"},
        "claims": {"devices": ["cpu"], "precisions": ["32-true", "16-mixed"], "world_sizes": [1], "features": []},
        "env": {},
        "results": rows,
        "summary": {},
    }


def test_page_from_small_reports(tmp_path: Path) -> None:
    """The page puts implementations side by side, gives each failing cell its reason, lists what is not claimed."""
    script = _script()
    long_reason = (
        "AssertionError: outcomes were [<StepOutcome.STEPPED: 'stepped'>, <StepOutcome.ACCUMULATED: 'accumulated'>] "
        "for the calls [" + "Call(optimizer=0), " * 10 + "]\nassert [...] == [...]"
    )
    reference = _document(
        "ref",
        "lightning_optimizer.reference",
        [
            _row("test_true_steps_now", "cpu/32-true/ws1", "passed"),
            _row("test_true_steps_now", "cpu/16-mixed/ws1", "passed"),
            _row("test_copies", "cpu/32-true/ws1", "passed", reqs=("PICKLE-001",)),
            _row("test_bf16_true_only", "cpu/bf16-true/ws1", "passed", reqs=("PREC-003",)),
        ],
    )
    peer = _document(
        "peer",
        "lightning_optimizer.peers.fabric",
        [
            _row("test_true_steps_now", "cpu/32-true/ws1", "passed"),
            _row("test_true_steps_now", "cpu/16-mixed/ws1", "failed", long_reason),
            _row("test_copies", "cpu/32-true/ws1", "n/a", "not claimed (feature pickling)", reqs=("PICKLE-001",)),
        ],
    )
    # Schema 2 leaves out the n/a rows of unclaimed cells, and names their checks instead.
    peer["left_out"] = {"cells": ["cpu/bf16-true/ws1"], "checks": ["test_bf16_true_only"], "why": "not claimed"}
    (tmp_path / "reference-0.json").write_text(json.dumps(reference), encoding="utf-8")
    (tmp_path / "fabric-0.json").write_text(json.dumps(peer), encoding="utf-8")
    meta = {
        "command": "make peers",
        "date": "2026-11-30",
        "contract_version": "2026.11",
        "versions": {"torch": "2.9.0", "accelerate": "1.15.0"},
        "runs": {
            "reference": [{"report": "reference-0.json", "devices": "cpu", "env": {}, "wall_s": 3.0}],
            "fabric": [{"report": "fabric-0.json", "devices": "cpu", "env": {}, "wall_s": 4.0}],
        },
        "notes": {"fabric": {"TRANSLATIONS": {"step": "optimizer.step()"}, "NOT_CLAIMED": {"pickling": "no"}}},
    }
    (tmp_path / "run.json").write_text(json.dumps(meta), encoding="utf-8")
    out = tmp_path / "peers.md"
    arguments = ["--render-only", "--only", "reference,fabric", "--reports", str(tmp_path), "--out", str(out)]
    assert script.main(arguments) == 0
    page = out.read_text(encoding="utf-8")
    assert "Generated by `make peers` on 2026-11-30. Versions: torch 2.9.0, accelerate 1.15.0." in page
    assert "| check | requirements | reference | Fabric |" in page
    assert "| `test_true_steps_now` | STEP-001 | ok | ok; FAIL: cpu/ws1: 16-mixed |" in page
    assert "| `test_copies` | PICKLE-001 | ok | not claimed |" in page
    assert "| `test_bf16_true_only` | PREC-003 | ok | not claimed |" in page
    reason = "- `test_true_steps_now`, Fabric (cpu/ws1: 16-mixed): outcomes were [S, A] for the calls [...]"
    assert reason in page
    assert "- not claimed, pickling: no" in page and "- `step`: optimizer.step()" in page
    assert "| STEP | 1/1 | 0/1 |" in page
    fabric = (tmp_path / "peers" / "fabric.html").read_text(encoding="utf-8")  # each implementation's HTML report
    assert sorted(path.name for path in (tmp_path / "peers").iterdir()) == ["fabric.html", "reference.html"]
    assert '<td class="name">test_true_steps_now</td>' in fabric and 'class="fail"' in fabric


def test_one_line_reasons() -> None:
    script = _script()
    raised = "lightning_fabric.utilities.exceptions.MisconfigurationException: closure should be callable\nmore"
    assert script.one_line(raised) == "MisconfigurationException: closure should be callable"
    assert len(script.one_line("AssertionError: " + "x" * 500)) == script.REASON_WIDTH
    assert script.describe_cells(["cpu/16-mixed/ws1", "cpu/32-true/ws2"], ["cpu/16-mixed/ws1", "cpu/32-true/ws2"]) == (
        "cpu/ws1; cpu/ws2"
    )
