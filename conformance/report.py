"""The result matrix: one outcome per check and cell, as a terminal summary, JSON and Markdown.

Besides the matrix, a report lists the declared deviations (stale ones say why) and what failed the run as a
whole (a required device on which nothing ran, stale entries under ``--strict-expected-failures``).

What the reports leave out: a result that is ``n/a`` because its cell is not claimed (the cell's device,
precision or world size is outside the implementation's ``claims``) is not listed; ``summary["n/a_left_out"]``
counts those results and ``left_out`` names their cells and checks and says why. Every other result is listed,
an ``n/a`` one inside a claimed cell included: it carries its own reason (the check does not apply to that cell,
or needs a feature that is not claimed). The outcome counts of ``summary`` are those of the listed results, so
the values of ``summary`` add up to every result of the run.

A result row (schema version 3) has ``check``, ``requirements``, ``device``, ``precision``, ``world_size``,
``strategy``, ``outcome``, ``reason``, ``observed`` and ``duration_s``. ``reason`` is why the outcome is what it is: the
failure's message for ``failed`` and ``error``, the declared reason for ``deviation``. ``observed`` is the
failure a declared deviation actually showed (empty for every other outcome), so that a reader can tell whether
the check still fails the way the declaration says.

The terminal gets a summary no wider than :data:`TERMINAL_WIDTH`: one row per cell with its outcomes counted, one
row per requirement group with a mark per device and precision (the worst outcome of the group's checks there),
the n/a results by reason, then one line per failed or erroring cell (at most :data:`REASON_LINES`), the first
meaningful line of its failure cut to fit; the per-check matrix only on request (``--matrix=full``). The Markdown
page puts a reason that spans several lines, or is longer than :data:`REASON_WIDTH`, in a collapsed ``<details>``
block with a fenced code block, below its one-line form; its text escapes what Markdown would act on (``|`` in
table cells). :mod:`~lightning_optimizer.conformance.html_report` renders the same document as an HTML page.
"""

from __future__ import annotations

import html
import importlib.metadata
import json
import platform
import re
import textwrap
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from lightning_optimizer.conformance.selection import WORLD_SIZES, devices_found
from lightning_optimizer.spec import DEVICE_KINDS, PRECISIONS, ImplementationInfo, requirement_group

__all__ = [
    "OUTCOMES",
    "COUNTED",
    "MARKS",
    "SYMBOLS",
    "Declaration",
    "Result",
    "build",
    "cell_counts",
    "column_of",
    "describe_cells",
    "environment",
    "failing_results",
    "group_marks",
    "matrix_rows",
    "n_a_cells",
    "not_applicable_notes",
    "one_line",
    "render_run_notes",
    "render_terminal",
    "shown_columns",
    "stale_entries",
    "summary_text",
    "to_json",
    "to_markdown",
]

OUTCOMES = ("passed", "failed", "error", "deviation", "n/a", "unavailable")
SCHEMA_VERSION = 3
"""Version 2 added ``observed`` to each result, and left out the n/a results of unclaimed cells (counted in
``summary["n/a_left_out"]``, described by ``left_out``); version 1 listed every result."""
LEFT_OUT = "n/a_left_out"
"""The key of ``summary`` that counts the n/a results left out (their cells are not claimed)."""
LEFT_OUT_WHY = (
    "not claimed: results are not listed where the cell's device, precision or world size is outside the "
    "implementation's claims (every check is n/a there); summary.n/a_left_out counts them"
)
REASON_WIDTH = 160
"""The widest line of reason: in the terminal, and in Markdown before a reason goes into a details block."""
TERMINAL_WIDTH = 120
"""The widest line the terminal summary prints (unless the full matrix is asked for)."""
MATRIX_CHOICES = ("summary", "full")
"""``--matrix``: the cells and requirement groups only, or the per-check matrix before them."""
REASON_LINES = 20
"""The most failed or erroring cells the terminal gives a line of reason; the reports list every one."""
_GROUP_MIN = 40
"""A bracketed value this long or longer may be cut to ``(...)`` in a reason that does not fit on one line."""
SYMBOLS = {  # the full matrix's symbol of each outcome
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
    strategy: str | None = None
    """How the cell's ranks share the model (``none``, ``ddp``, ``fsdp``)."""
    outcome: str | None = None
    reason: str = ""
    observed: str = ""
    """For a declared deviation, the failure the check showed (``reason`` is then the declared reason)."""
    duration_s: float = 0.0
    column: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        cell = {"device": self.device, "precision": self.precision, "world_size": self.world_size}
        self.column = column_of(cell | {"strategy": self.strategy})


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
    """The report document (the JSON schema, see the module's docstring).

    ``declarations``: every expected-failure entry; ``run_failures``: why the run fails beyond its results. The
    n/a results of cells that ``info`` does not claim are left out: counted in ``summary["n/a_left_out"]``, their
    cells named in ``left_out["cells"]`` and their checks in ``left_out["checks"]``.
    """
    rows: list[dict[str, Any]] = []
    left_out: list[dict[str, Any]] = []
    for result in results:
        row = asdict(result) | {"outcome": result.outcome or "error"}
        del row["column"]
        (left_out if row["outcome"] == "n/a" and not _claimed(info, result) else rows).append(row)
    counts = Counter(row["outcome"] for row in rows)
    return {
        "schema_version": SCHEMA_VERSION,
        "contract_version": info.contract_version,
        "impl": {"name": info.name, "module": module, "version": info.version},
        "claims": {
            "devices": sorted(info.devices),
            "precisions": sorted(info.precisions),
            "world_sizes": sorted(info.world_sizes),
            "strategies": sorted(info.strategies),
            "features": sorted(info.features),
        },
        "env": environment(),
        "results": rows,
        "summary": {outcome: counts.get(outcome, 0) for outcome in OUTCOMES} | {LEFT_OUT: len(left_out)},
        "left_out": {
            "cells": sorted({column_of(row) for row in left_out}, key=_column_key),
            "checks": sorted({row["check"] for row in left_out}),
            "why": LEFT_OUT_WHY,
        },
        "expected_failures": [asdict(declaration) for declaration in declarations],
        "required_devices": list(required_devices),
        "run_failures": list(run_failures),
    }


def _claimed(info: ImplementationInfo[Any], result: Result) -> bool:
    """Whether the implementation claims the result's cell (a check without a cell: always)."""
    return result.device is None or (
        result.device in info.devices
        and result.precision in info.precisions
        and result.world_size in info.world_sizes
        and (result.strategy or "none") in info.strategies
    )


_ORDER: dict[str, int] = {name: i for i, name in enumerate(DEVICE_KINDS + PRECISIONS)}


def _column_key(column: str) -> tuple[int, ...]:
    if column == _ANY_CELL:
        return (-1,)
    device, precision, world = column.split("/")
    size, _, strategy = world.removeprefix("ws").partition("-")
    return (_ORDER[device], int(size), bool(strategy), _ORDER[precision])


def column_of(row: dict[str, Any]) -> str:
    """A result row's cell as the matrix names it: ``device/precision/wsN`` (``wsN-fsdp`` sharded), or ``any``."""
    if row["device"] is None:
        return _ANY_CELL
    suffix = "-fsdp" if row.get("strategy") == "fsdp" else ""
    return f"{row['device']}/{row['precision']}/ws{row['world_size']}{suffix}"


def matrix_rows(document: dict[str, Any]) -> tuple[list[str], list[tuple[str, str, dict[str, str]]]]:
    """Columns (cells) and rows (check, requirement ids, outcome per column)."""
    columns: set[str] = set()
    rows: dict[str, tuple[str, dict[str, str]]] = {}
    for row in document["results"]:
        column = column_of(row)
        columns.add(column)
        _, outcomes = rows.setdefault(row["check"], (" ".join(row["requirements"]), {}))
        outcomes[column] = row["outcome"]
    ordered = sorted(rows.items(), key=lambda item: (item[1][0], item[0]))
    return sorted(columns, key=_column_key), [(check, reqs, outcomes) for check, (reqs, outcomes) in ordered]


def shown_columns(columns: list[str], rows: list[tuple[str, str, dict[str, str]]]) -> tuple[list[str], list[str]]:
    """Columns with at least one outcome other than ``n/a``, and the columns that are ``n/a`` throughout."""
    shown = [c for c in columns if any(outcomes.get(c, "n/a") != "n/a" for _, _, outcomes in rows)]
    return shown, [c for c in columns if c not in shown]


_GROUP = re.compile(rf"\([^()]{{{_GROUP_MIN},}}\)|\[[^\[\]]{{{_GROUP_MIN},}}\]")
"""An innermost bracketed value of at least ``_GROUP_MIN`` characters between its brackets."""


def one_line(reason: str, width: int = REASON_WIDTH) -> str:
    """A failure's reason as one line of at most ``width`` characters.

    The first non-blank line (an exception's type and message; an ``AssertionError``'s message alone), joined
    with the next one where it is only an exception's type. Too long, it loses its longest bracketed values
    (``Call(...)``) first, then its end (cut with ``...``). ``(no message)`` for an empty reason.
    """
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    if not lines:
        return "(no message)"
    first = lines[0]
    if len(lines) > 1 and re.fullmatch(r"[A-Za-z_][\w.]*:?", first):
        first = f"{first.removesuffix(':')}: {lines[1]}"
    first = first.removeprefix("AssertionError: ")
    while len(first) > width and (groups := list(_GROUP.finditer(first))):
        longest = max(groups, key=lambda match: len(match[0]))
        first = f"{first[: longest.start() + 1]}...{first[longest.end() - 1 :]}"
    return first if len(first) <= width else first[: max(width - 3, 1)].rstrip() + "..."


def failing_results(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The failed and erroring results, in the matrix's order (rows, then cells)."""
    problems = [row for row in document["results"] if row["outcome"] in ("failed", "error")]
    return sorted(problems, key=lambda r: (" ".join(r["requirements"]), r["check"], _column_key(column_of(r))))


def _reason_lines(document: dict[str, Any], width: int = TERMINAL_WIDTH) -> list[str]:
    """One line per failed or erroring cell (at most ``REASON_LINES``): outcome, check, cell, first line of why.

    No line is longer than ``width``.
    """
    problems = failing_results(document)
    if not problems:
        return []
    cells = "cell" if len(problems) == 1 else "cells"
    lines = [f"why ({len(problems)} failed or erroring {cells}; the first line of each failure):"]
    for row in problems[:REASON_LINES]:
        cell = column_of(row)
        check = one_line(row["check"], max(width * 11 // 20 - len(cell) - 10, 24))  # the reason keeps most of the line
        prefix = f"  {SYMBOLS[row['outcome']]:<4} {check} ({cell}): "
        lines.append(prefix + one_line(row["reason"], width - len(prefix)))
    if len(problems) > REASON_LINES:
        lines += _wrap(
            f"  ... and {len(problems) - REASON_LINES} more: the reports (--report-json, --report-md, "
            "--report-html) give every reason in full",
            width,
        )
    return lines


def describe_cells(cells: Sequence[str]) -> str:
    """Cells ``device/precision/wsN`` in short, e.g. ``cpu/ws1: 16-mixed, bf16-true; cpu/ws2; cuda``.

    A device and world size (``wsN``, or ``wsN-fsdp`` sharded) alone stands for every precision there; a device
    alone, for every cell of it.
    """
    places: dict[str, dict[str, list[str]]] = {}
    for cell in sorted(cells, key=_column_key):
        if cell != _ANY_CELL:
            device, precision, world = cell.split("/")
            places.setdefault(device, {}).setdefault(world, []).append(precision)
    every_world = {f"ws{size}" for size in WORLD_SIZES} | {f"ws{size}-fsdp" for size in WORLD_SIZES if size > 1}
    parts = []
    for device, worlds in places.items():
        whole = {world for world, precisions in worlds.items() if set(precisions) == set(PRECISIONS)}
        if whole == every_world:
            parts.append(device)
            continue
        for world, precisions in worlds.items():
            parts.append(f"{device}/{world}" + ("" if world in whole else f": {', '.join(precisions)}"))
    return "; ".join(parts)


def _left_out(document: dict[str, Any]) -> tuple[int, list[str]]:
    """How many n/a results of unclaimed cells the document leaves out, and their cells."""
    cells: list[str] = document.get("left_out", {}).get("cells", [])
    return int(document["summary"].get(LEFT_OUT, 0)), cells


def summary_text(document: dict[str, Any]) -> str:
    """The outcome counts in one line, and the n/a results left out with their unclaimed cells."""
    summary = document["summary"]
    text = ", ".join(f"{summary[o]} {o}" for o in OUTCOMES)
    count, _ = _left_out(document)
    return text + (f"; {count} n/a left out (cells not claimed)" if count else "")


def render_terminal(document: dict[str, Any], *, matrix: str = "summary") -> list[str]:
    """The run as lines of at most :data:`TERMINAL_WIDTH` characters (``matrix="full"``: the per-check matrix first).

    Then one row per cell with its counts of each outcome, one row per requirement group with a mark per device
    and precision, the n/a results by reason, one line of reason per failed or erroring cell, and the run notes.
    Only the full matrix, asked for, may be wider than the terminal.
    """
    if matrix not in MATRIX_CHOICES:
        raise ValueError(f"matrix must be one of {', '.join(MATRIX_CHOICES)}, not {matrix!r}")
    lines = _full_matrix(document) if matrix == "full" else []
    if document["results"]:
        lines += [*_cell_table(document), "", *_group_table(document), ""]
    else:
        lines.append("no check ran in a cell the implementation claims")
    notes = ["summary: " + summary_text(document), *not_applicable_notes(document), LEGEND]
    lines += [wrapped for note in notes for wrapped in _wrap(note)]
    return lines + _reason_lines(document) + [wrapped for note in render_run_notes(document) for wrapped in _wrap(note)]


LEGEND = (
    "legend: ok passed, FAIL failed or error, dev declared deviation, -- unavailable on this machine, . nothing "
    "applies (n/a); a mark is the worst outcome of its checks that ran"
)


def _wrap(text: str, width: int = TERMINAL_WIDTH) -> list[str]:
    """A note as lines of at most ``width`` characters, the lines after the first indented by two spaces."""
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


def _full_matrix(document: dict[str, Any]) -> list[str]:
    """Every check (rows) in every claimed cell (columns): as wide as the cells need."""
    columns, rows = matrix_rows(document)
    columns, hidden = shown_columns(columns, rows)
    if not rows:
        return []
    check_width = max([len("check")] + [len(check) for check, _, _ in rows])
    widths = [max(len(column), 4) for column in columns]
    header = ["check".ljust(check_width), *(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines = ["  ".join(header).rstrip()]
    for check, _, outcomes in rows:
        symbols = [SYMBOLS.get(outcomes.get(c, ""), "").ljust(w) for c, w in zip(columns, widths, strict=True)]
        lines.append("  ".join([check.ljust(check_width), *symbols]).rstrip())
    if hidden:
        lines.append(f"n/a throughout (not applicable, or a feature not claimed): {', '.join(hidden)}")
    return [*lines, ""]


def cell_counts(document: dict[str, Any]) -> list[tuple[str, Counter[str]]]:
    """Per cell of the document (``any`` for the checks that take none), in matrix order: its outcomes counted."""
    counts: dict[str, Counter[str]] = {}
    for row in document["results"]:
        counts.setdefault(column_of(row), Counter())[row["outcome"]] += 1
    return sorted(counts.items(), key=lambda item: _column_key(item[0]))


def n_a_cells(document: dict[str, Any]) -> list[str]:
    """The claimed cells where every check is n/a (they have no row in the cell tables)."""
    return [column for column, counts in cell_counts(document) if counts["n/a"] == counts.total()]


def _cell_table(document: dict[str, Any]) -> list[str]:
    headings = ["cell", *COUNTED]
    hidden = n_a_cells(document)
    rows = [
        [column, *(str(counts[o]) for o in COUNTED)] for column, counts in cell_counts(document) if column not in hidden
    ]
    widths = [max(len(row[i]) for row in [headings, *rows]) for i in range(len(headings))]

    def line(cells: list[str]) -> str:
        return "  ".join([cells[0].ljust(widths[0]), *(c.rjust(w) for c, w in zip(cells[1:], widths[1:], strict=True))])

    notes = _wrap(f"n/a throughout (no check applies): {describe_cells(hidden)}") if hidden else []
    return [line(headings), *map(line, rows), *notes]


COUNTED = ("passed", "failed", "error", "deviation", "n/a", "unavailable")
"""The outcomes the cell tables count, in their column order."""
_WORST = ("failed", "error", "deviation", "passed", "unavailable", "n/a")
"""A group's mark in a device and precision: the first of these among its checks' outcomes there."""
MARKS = {  # the requirement-group table's mark of a group's worst outcome
    "failed": "FAIL",
    "error": "FAIL",
    "deviation": "dev",
    "passed": "ok",
    "unavailable": "--",
    "n/a": ".",
}
_SHORT = {
    "64-true": "64",
    "32-true": "32",
    "16-mixed": "16m",
    "bf16-mixed": "b16m",
    "bf16-true": "b16t",
    "16-true": "16t",
}
"""Precisions as the group table's columns name them: four characters at most, so that six precisions on three
devices fit 120 columns."""


def group_marks(document: dict[str, Any]) -> tuple[list[tuple[str, str]], dict[str, dict[tuple[str, str], str]]]:
    """The group table's columns and, per requirement group, the worst outcome of its checks in each column.

    Columns are the (device, precision) pairs that have results, then ``("any", "")`` for checks without a cell;
    "worst" is the first of :data:`_WORST` among the outcomes there.
    """
    seen: dict[str, dict[tuple[str, str], set[str]]] = {}
    for row in document["results"]:
        column = ("any", "") if row["device"] is None else (row["device"], row["precision"])
        for group in {requirement_group(rid) for rid in row["requirements"]}:
            seen.setdefault(group, {}).setdefault(column, set()).add(row["outcome"])
    present = {(row["device"], row["precision"]) for row in document["results"]}
    columns: list[tuple[str, str]] = [
        (device, precision) for device in DEVICE_KINDS for precision in PRECISIONS if (device, precision) in present
    ]
    if any(("any", "") in outcomes for outcomes in seen.values()):
        columns.append(("any", ""))
    marks = {
        group: {column: next(o for o in _WORST if o in found) for column, found in outcomes.items()}
        for group, outcomes in sorted(seen.items())
    }
    return columns, marks


def _group_table(document: dict[str, Any]) -> list[str]:
    """One row per requirement group, a block of columns per device (one per precision), a mark in each."""
    columns, marks = group_marks(document)
    blocks: dict[str, list[str]] = {}  # device: its precisions as the table names them
    for device, precision in columns:
        blocks.setdefault(device, []).append(_SHORT.get(precision, ""))
    width = max(len(label) for label in [*_SHORT.values(), *MARKS.values()])
    first = max([len("requirements"), *map(len, marks)])

    def line(label: str, blocks_text: list[str]) -> str:
        return "  ".join([label.ljust(first), *blocks_text]).rstrip()

    def block(cells: list[str]) -> str:
        return " ".join(cell.ljust(width) for cell in cells)

    lines = [
        line("requirements", [device.ljust(len(block(ps))) for device, ps in blocks.items()]),
        line("", [block(ps) for ps in blocks.values()]),
    ]
    for group, found in marks.items():
        marked = [MARKS[found[column]] if column in found else "" for column in columns]
        texts, start = [], 0
        for ps in blocks.values():
            texts.append(block(marked[start : start + len(ps)]))
            start += len(ps)
        lines.append(line(group, texts))
    return lines


def not_applicable_notes(document: dict[str, Any]) -> list[str]:
    """The n/a results by reason, those of unclaimed cells (left out of the reports) included."""
    kinds = Counter(_na_kind(row["reason"]) for row in document["results"] if row["outcome"] == "n/a")
    count, left = _left_out(document)
    if count:
        kinds[f"in cells not claimed, left out of the reports ({describe_cells(left)})"] += count
    if not kinds:
        return []
    total = sum(kinds.values())
    parts = "; ".join(f"{n} {kind}" for kind, n in kinds.most_common())
    return [f"n/a, deselected: {total} ({parts})"]


def _na_kind(reason: str) -> str:
    """An n/a reason without the cell it names: the plugin's reasons differ only by the cell."""
    if reason.startswith("the check does not apply to"):
        return "the check does not apply to the cell"
    return reason


def stale_entries(document: dict[str, Any]) -> list[dict[str, Any]]:
    """The expected-failure entries that named no check that ran."""
    return [row for row in document.get("expected_failures", []) if row["stale"]]


def render_run_notes(document: dict[str, Any]) -> list[str]:
    """Lines on stale expected-failure entries and on what failed the run as a whole (none when all is well)."""
    lines = []
    stale = stale_entries(document)
    if stale:
        lines.append(f"stale expected-failure entries ({len(stale)}; they name no check that ran):")
        lines += [f"  {row['entry']} ({row['source']}): {row['why_stale']}" for row in stale]
    lines += [f"run failed: {failure}" for failure in document.get("run_failures", [])]
    return lines


def to_json(document: dict[str, Any]) -> str:
    """The report as JSON."""
    return json.dumps(document, indent=2, sort_keys=False) + "\n"


_MD_SPECIAL = re.compile(r"([\\`*_<>|\[\]~])")


def _md_text(text: str) -> str:
    """Plain text for a Markdown paragraph or table cell: every character Markdown or HTML would act on escaped."""
    return _MD_SPECIAL.sub(r"\\\1", text)


def _md_code(text: str, *, in_table: bool = False) -> str:
    """Text as an inline code span; in a table cell with ``|`` escaped, so that the cell does not split there."""
    return f"`{text}`".replace("|", "\\|") if in_table else f"`{text}`"


def _needs_block(text: str) -> bool:
    return "\n" in text.strip() or len(text.strip()) > REASON_WIDTH


def _md_block(label: str, text: str, indent: str = "  ") -> list[str]:
    """``text`` in full, in a collapsed ``<details>`` block with a fenced code block, inside a list item."""
    body = [line.rstrip() for line in text.strip("\n").splitlines()]
    runs = [len(run) for run in re.findall(r"`+", text)]
    fence = "`" * max([3, *(n + 1 for n in runs)])
    size = "1 line" if len(body) == 1 else f"{len(body)} lines"
    return [
        "",
        f"{indent}<details><summary>{html.escape(label)} ({size})</summary>",
        "",
        f"{indent}{fence}text",
        *(f"{indent}{line}".rstrip() for line in body),
        f"{indent}{fence}",
        "",
        f"{indent}</details>",
        "",
    ]


def _md_problem(row: dict[str, Any]) -> list[str]:
    """The list item of one failed, erroring or deviating result: its reason on one line, in full below if long."""
    where = "any cell" if row["device"] is None else column_of(row)
    reason, observed = row["reason"], row.get("observed", "")
    head = f"- {_md_code(row['check'])} on {where}: **{row['outcome']}**: {_md_text(one_line(reason))}"
    if row["outcome"] == "deviation" and observed:
        head += f"; observed: {_md_text(one_line(observed))}"
    lines = [head]
    if _needs_block(reason):
        lines += _md_block("declared reason" if row["outcome"] == "deviation" else "full message", reason)
    if row["outcome"] == "deviation" and _needs_block(observed):
        lines += _md_block("observed failure", observed)
    return lines


def to_markdown(document: dict[str, Any]) -> str:
    """The report as a Markdown page: the matrix, then each failure's, error's and deviation's reason.

    A reason is given on one line in its list item (a deviation's: the declared reason, then the failure it
    showed); one that spans several lines or is longer than ``REASON_WIDTH`` follows in full, in a collapsed
    details block. Text in table cells escapes ``|``.
    """
    impl, env = document["impl"], document["env"]
    columns, rows = matrix_rows(document)
    columns, hidden = shown_columns(columns, rows)
    lines = [
        f"# Conformance: {impl['name']} {impl['version']}",
        "",
        f"Contract {document['contract_version']}; module `{impl['module']}`; torch {env['torch']}, "
        f"torch_xla {env['torch_xla']}, Lightning {env['lightning']}, Python {env['python']}; devices found: "
        f"{', '.join(env['devices_found'])}.",
        "",
        "Summary: " + summary_text(document) + ".",
        "",
    ]
    if rows:
        lines += ["| check | requirements | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
        for check, reqs, outcomes in rows:
            cells = [_md_text(reqs), *(outcomes.get(c, "") for c in columns)]
            lines.append(f"| {_md_code(check, in_table=True)} | " + " | ".join(cells) + " |")
    else:
        lines.append("No check ran in a cell the implementation claims.")
    if hidden:
        lines += [
            "",
            f"Cells that are n/a for every check (not applicable, or a feature not claimed): {', '.join(hidden)}.",
        ]
    count, left = _left_out(document)
    if left:
        lines += ["", f"Cells not claimed, left out of the report ({count} n/a results): {describe_cells(left)}."]
    problems = failing_results(document) + [r for r in document["results"] if r["outcome"] == "deviation"]
    if problems:
        lines += ["", "## Failures, errors and deviations", ""]
        for row in problems:
            lines += _md_problem(row)
    stale = stale_entries(document)
    if stale:
        lines += ["", "## Stale expected-failure entries", ""]
        lines += [f"- {_md_code(row['entry'])} ({row['source']}): {_md_text(row['why_stale'])}" for row in stale]
    if document.get("run_failures"):
        lines += ["", "## The run failed", ""]
        lines += [f"- {_md_text(failure)}" for failure in document["run_failures"]]
    return "\n".join(lines).rstrip("\n") + "\n"
