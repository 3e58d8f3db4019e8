"""The result matrix: one outcome per check and cell, as a terminal table, JSON and Markdown.

Besides the matrix, a report lists the declared deviations (stale ones say why) and what failed the run as a
whole (a required device on which nothing ran, stale entries under ``--strict-expected-failures``).
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from lightning_optimizer.conformance.selection import devices_found
from lightning_optimizer.spec import DEVICE_KINDS, PRECISIONS, ImplementationInfo

__all__ = [
    "OUTCOMES",
    "Declaration",
    "Result",
    "build",
    "environment",
    "render_run_notes",
    "render_terminal",
    "to_json",
    "to_markdown",
]

OUTCOMES = ("passed", "failed", "error", "deviation", "n/a", "unavailable")
SCHEMA_VERSION = 1
_SYMBOLS = {
    "passed": "ok",
    "failed": "FAIL",
    "error": "ERR",
    "deviation": "dev",
    "n/a": "n/a",
    "unavailable": "--",
}
_ANY_CELL = "any"


@dataclass
class Result:
    """The outcome of one check in one cell (``device`` etc. are ``None`` for checks that take no cell)."""

    check: str
    requirements: list[str]
    device: str | None
    precision: str | None
    world_size: int | None
    outcome: str | None = None
    reason: str = ""
    duration_s: float = 0.0
    column: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.column = _ANY_CELL if self.device is None else f"{self.device}/{self.precision}/ws{self.world_size}"


@dataclass(frozen=True)
class Declaration:
    """A declared deviation (an expected-failure entry) and whether it is stale: it named no check that ran."""

    entry: str
    reason: str
    source: str
    stale: bool = False
    why_stale: str = ""


def _version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """Versions and devices of this machine."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_xla": _version("torch_xla"),
        "lightning": _version("pytorch-lightning") or _version("lightning"),
        "devices_found": devices_found(),
    }


def build(
    info: ImplementationInfo[Any],
    module: str,
    results: list[Result],
    *,
    declarations: Sequence[Declaration] = (),
    required_devices: Sequence[str] = (),
    run_failures: Sequence[str] = (),
) -> dict[str, Any]:
    """The report document (the JSON schema).

    ``declarations``: every expected-failure entry; ``run_failures``: why the run fails beyond its results.
    """
    rows = [asdict(result) | {"outcome": result.outcome or "error"} for result in results]
    for row in rows:
        del row["column"]
    counts = Counter(row["outcome"] for row in rows)
    return {
        "schema_version": SCHEMA_VERSION,
        "contract_version": info.contract_version,
        "impl": {"name": info.name, "module": module, "version": info.version},
        "claims": {
            "devices": sorted(info.devices),
            "precisions": sorted(info.precisions),
            "world_sizes": sorted(info.world_sizes),
            "features": sorted(info.features),
        },
        "env": environment(),
        "results": rows,
        "summary": {outcome: counts.get(outcome, 0) for outcome in OUTCOMES},
        "expected_failures": [asdict(declaration) for declaration in declarations],
        "required_devices": list(required_devices),
        "run_failures": list(run_failures),
    }


def _matrix(document: dict[str, Any]) -> tuple[list[str], list[tuple[str, str, dict[str, str]]]]:
    """Columns (cells) and rows (check, requirement ids, outcome per column)."""
    order: dict[str, int] = {name: i for i, name in enumerate(DEVICE_KINDS + PRECISIONS)}

    def column_key(column: str) -> tuple[int, ...]:
        if column == _ANY_CELL:
            return (-1,)
        device, precision, world = column.split("/")
        return (order[device], int(world.removeprefix("ws")), order[precision])

    columns: set[str] = set()
    rows: dict[str, tuple[str, dict[str, str]]] = {}
    for row in document["results"]:
        column = _ANY_CELL if row["device"] is None else f"{row['device']}/{row['precision']}/ws{row['world_size']}"
        columns.add(column)
        _, outcomes = rows.setdefault(row["check"], (" ".join(row["requirements"]), {}))
        outcomes[column] = row["outcome"]
    ordered = sorted(rows.items(), key=lambda item: (item[1][0], item[0]))
    return sorted(columns, key=column_key), [(check, reqs, outcomes) for check, (reqs, outcomes) in ordered]


def _shown(columns: list[str], rows: list[tuple[str, str, dict[str, str]]]) -> tuple[list[str], list[str]]:
    """Columns with at least one outcome other than ``n/a``, and the columns that are ``n/a`` throughout."""
    shown = [c for c in columns if any(outcomes.get(c, "n/a") != "n/a" for _, _, outcomes in rows)]
    return shown, [c for c in columns if c not in shown]


def render_terminal(document: dict[str, Any]) -> list[str]:
    """The matrix as fixed-width lines: rows are checks, columns are cells (all-n/a cells listed below)."""
    columns, rows = _matrix(document)
    columns, hidden = _shown(columns, rows)
    check_width = max([len("check")] + [len(check) for check, _, _ in rows])
    widths = [max(len(column), 4) for column in columns]
    lines = ["  ".join(["check".ljust(check_width), *(c.ljust(w) for c, w in zip(columns, widths, strict=True))])]
    for check, _, outcomes in rows:
        cells = [_SYMBOLS.get(outcomes.get(c, ""), "") for c in columns]
        lines.append(
            "  ".join([check.ljust(check_width), *(s.ljust(w) for s, w in zip(cells, widths, strict=True))]).rstrip()
        )
    if hidden:
        lines.append(f"n/a throughout (not claimed or not applicable): {', '.join(hidden)}")
    summary = document["summary"]
    lines.append("summary: " + ", ".join(f"{summary[o]} {o}" for o in OUTCOMES))
    lines.append(
        "legend: ok passed, FAIL failed, ERR error, dev declared deviation, n/a not claimed or not "
        "applicable, -- unavailable on this machine"
    )
    return lines + render_run_notes(document)


def _stale(document: dict[str, Any]) -> list[dict[str, Any]]:
    return [row for row in document.get("expected_failures", []) if row["stale"]]


def render_run_notes(document: dict[str, Any]) -> list[str]:
    """Lines on stale expected-failure entries and on what failed the run as a whole (none when all is well)."""
    lines = []
    stale = _stale(document)
    if stale:
        lines.append(f"stale expected-failure entries ({len(stale)}; they name no check that ran):")
        lines += [f"  {row['entry']} ({row['source']}): {row['why_stale']}" for row in stale]
    lines += [f"run failed: {failure}" for failure in document.get("run_failures", [])]
    return lines


def to_json(document: dict[str, Any]) -> str:
    """The report as JSON."""
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


def to_markdown(document: dict[str, Any]) -> str:
    """The report as a Markdown page with the matrix and the failures' reasons."""
    impl, env = document["impl"], document["env"]
    columns, rows = _matrix(document)
    columns, hidden = _shown(columns, rows)
    lines = [
        f"# Conformance: {impl['name']} {impl['version']}",
        "",
        f"Contract {document['contract_version']}; module `{impl['module']}`; torch {env['torch']}, "
        f"torch_xla {env['torch_xla']}, Lightning {env['lightning']}, Python {env['python']}; devices found: "
        f"{', '.join(env['devices_found'])}.",
        "",
        "Summary: " + ", ".join(f"{document['summary'][o]} {o}" for o in OUTCOMES) + ".",
        "",
        "| check | requirements | " + " | ".join(columns) + " |",
        "|---|---|" + "---|" * len(columns),
    ]
    for check, reqs, outcomes in rows:
        lines.append(f"| `{check}` | {reqs} | " + " | ".join(outcomes.get(c, "") for c in columns) + " |")
    if hidden:
        lines += [
            "",
            f"Cells that are n/a for every check (not claimed or not applicable): {', '.join(hidden)}.",
        ]
    problems = [r for r in document["results"] if r["outcome"] in ("failed", "error", "deviation")]
    if problems:
        lines += ["", "## Failures, errors and deviations", ""]
        for r in problems:
            where = "any cell" if r["device"] is None else f"{r['device']}/{r['precision']}/ws{r['world_size']}"
            lines.append(f"- `{r['check']}` on {where}: **{r['outcome']}**: {r['reason']}")
    stale = _stale(document)
    if stale:
        lines += ["", "## Stale expected-failure entries", ""]
        lines += [f"- `{row['entry']}` ({row['source']}): {row['why_stale']}" for row in stale]
    if document.get("run_failures"):
        lines += ["", "## The run failed", ""]
        lines += [f"- {failure}" for failure in document["run_failures"]]
    return "\n".join(lines) + "\n"
