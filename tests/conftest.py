"""The mutation report of ``tests/test_mutants.py``: a kill-rate table per requirement group, and a JSON file.

The table ends with the blind batches' mutants (``blind``); the JSON gives each mutant's ``blind`` batch and the
kill rate per batch.

Also: the Lightning tests run in the namespace ``LIGHTNING_NAMESPACE`` names (``lightning``, the default, or
``pytorch_lightning``: see ``lightning_scenarios/namespace.py``; the report's header says which); tests marked
``xla_device`` bring torch_xla's device up before any test runs (``start_xla_early``), and the
mypy runs of the suite sessions these tests start share one cache (``MYPY_CACHE_DIR``, unless already set).

``pytest tests/test_mutants.py --mutation-report=reports/mutation.json`` prints the table after the run, writes
the report and fails the run (exit status 1) when any mutant that ran here survived, known gaps included. Without
the option the table is printed whenever mutants ran. Each ``test_mutant_is_caught`` records its verdict through
the ``mutation_verdicts`` fixture.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the Lightning tests' scenarios package
import lightning_scenarios  # noqa: F401  # the Lightning namespace of this run (LIGHTNING_NAMESPACE), first

from lightning_optimizer.spec import REQUIREMENTS, requirement_group

VERDICTS = pytest.StashKey[dict[str, dict[str, Any]]]()

KILLED, SURVIVED, UNAVAILABLE = "killed", "survived", "unavailable"


def pytest_configure(config: pytest.Config) -> None:
    # tests/test_dimensions.py imports check modules of the suite, whose markers the suite's plugin registers.
    from lightning_optimizer.conformance.plugin import MARKERS

    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    config.addinivalue_line("markers", "xla_device: runs on torch_xla's device (skipped where torch_xla is missing)")


def pytest_report_header(config: pytest.Config) -> str:
    from lightning_scenarios.namespace import ENVIRONMENT, selected

    return f"Lightning namespace: {selected()} ({ENVIRONMENT})"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """torch_xla's device cannot join autograd after a first CPU backward: start it before any test runs."""
    if importlib.util.find_spec("torch_xla") is not None and any(
        item.get_closest_marker("xla_device") for item in items
    ):
        from lightning_optimizer.conformance.selection import start_xla_early

        start_xla_early()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--mutation-report",
        default=None,
        metavar="PATH",
        help="write the mutation report of tests/test_mutants.py as JSON to PATH; any surviving mutant fails the run",
    )


@pytest.fixture(scope="session", autouse=True)
def _one_mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The suite's static check and the README's mypy command, in every run these tests start, share one cache.

    They all run mypy with the same options (``--strict``, no configuration file), so only the first run of the
    session analyses torch cold. The static check uses mypy's own ``MYPY_CACHE_DIR`` where it is set.
    """
    if "MYPY_CACHE_DIR" in os.environ:
        yield
        return
    os.environ["MYPY_CACHE_DIR"] = str(tmp_path_factory.mktemp("mypy-cache"))
    try:
        yield
    finally:
        del os.environ["MYPY_CACHE_DIR"]


@pytest.fixture(scope="session")
def mutation_verdicts(pytestconfig: pytest.Config) -> dict[str, dict[str, Any]]:
    """Mutant name -> ``{"requirement", "blind", "cells", "status", "caught_by", "detail"}``, from the meta-test.

    The name is the module's under ``mutants`` (``amp.unscaled_twice``); ``blind`` the blind batch that wrote it, or
    ``None``.
    """
    return pytestconfig.stash.setdefault(VERDICTS, {})


def _tally(mutants: list[dict[str, Any]]) -> dict[str, Any]:
    """How many of ``mutants`` there are, ran here, were killed, and the kill rate of those that ran."""
    ran = [m for m in mutants if m["status"] != UNAVAILABLE]
    killed = sum(m["killed"] for m in ran)
    return {"mutants": len(mutants), "run": len(ran), "killed": killed, "kill_rate": killed / len(ran) if ran else None}


def mutation_report(verdicts: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The report: totals, the kill rate of each requirement group and of the blind batches, every mutant's verdict."""
    mutants = [
        {"name": name, "group": requirement_group(verdict["requirement"]), "killed": verdict["status"] == KILLED}
        | verdict
        for name, verdict in sorted(verdicts.items())
    ]
    groups = {
        group: _tally([m for m in mutants if m["group"] == group])
        for group in sorted({requirement_group(rule_id) for rule_id in REQUIREMENTS})
    }
    blind = [m for m in mutants if m.get("blind") is not None]
    batches = {
        batch: _tally([m for m in blind if m["blind"] == batch]) for batch in sorted({m["blind"] for m in blind})
    }
    ran = [m for m in mutants if m["status"] != UNAVAILABLE]
    killed = sum(m["killed"] for m in ran)
    return {
        "mutants": mutants,
        "total": len(mutants),
        "run": len(ran),
        "killed": killed,
        "survived": [m["name"] for m in ran if not m["killed"]],
        "unavailable": [m["name"] for m in mutants if m["status"] == UNAVAILABLE],
        "kill_rate": killed / len(ran) if ran else None,
        "groups": groups,
        "blind": _tally(blind) | {"batches": batches},
    }


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def render_table(report: dict[str, Any]) -> list[str]:
    """The kill rate per requirement group, then the totals, the blind batches' mutants, and any survivor."""
    lines = [f"{'group':<10}{'mutants':>8}{'run':>6}{'killed':>8}{'rate':>7}"]
    for group, row in report["groups"].items():
        note = "" if row["mutants"] else "  no mutant breaks this group"
        lines.append(
            f"{group:<10}{row['mutants']:>8}{row['run']:>6}{row['killed']:>8}{_rate(row['kill_rate']):>7}{note}"
        )
    lines.append(
        f"{'all':<10}{report['total']:>8}{report['run']:>6}{report['killed']:>8}{_rate(report['kill_rate']):>7}"
    )
    blind = report["blind"]
    if blind["mutants"]:
        lines.append(
            f"{'blind':<10}{blind['mutants']:>8}{blind['run']:>6}{blind['killed']:>8}{_rate(blind['kill_rate']):>7}"
            "  written from the spec text alone (mutants._declared.BLIND_BATCHES)"
        )
    for mutant in report["mutants"]:
        if mutant["status"] == SURVIVED:
            lines.append(f"survived: {mutant['name']} ({mutant['requirement']}): {mutant['detail'][:300]}")
    if report["unavailable"]:
        lines.append(f"not run here (unavailable): {', '.join(report['unavailable'])}")
    return lines


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    verdicts = config.stash.get(VERDICTS, None)
    if not verdicts:
        return
    report = mutation_report(verdicts)
    terminalreporter.section("mutation report: kill rate per requirement group")
    for line in render_table(report):
        terminalreporter.write_line(line)
    path = config.getoption("mutation_report")
    if path:
        target = Path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        terminalreporter.write_line(f"mutation report written to {target}")


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    verdicts = session.config.stash.get(VERDICTS, None) or {}
    survived = any(verdict["status"] == SURVIVED for verdict in verdicts.values())
    if session.config.getoption("mutation_report") and survived:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
