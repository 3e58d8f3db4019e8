"""The result matrix as one self-contained HTML page, for a person to open, publish or attach.

One file: its style inline, no script, no font, image or link outside the page (``--report-html=PATH``). It shows
what the terminal summary shows and what the Markdown report lists, laid out for a browser:

- the implementation, what it claims, and the machine it ran on (Python, torch, torch_xla, Lightning, devices);
- the totals, the n/a results by reason, and a table of requirement groups with a mark per device and precision;
- the outcome counts per cell;
- the matrix, checks by cells, each cell coloured by its outcome; a failed, erroring or deviating cell carries its
  reason as a tooltip and links to it below the matrix (its first lines; the other reports keep them all);
- stale expected-failure entries and what failed the run as a whole.

Every text of the document is escaped: a reason may hold ``<``, ``&`` or quotes.
"""

from __future__ import annotations

from html import escape
from typing import Any

from lightning_optimizer.conformance import report

__all__ = ["render"]

_CLASS = {
    "passed": "ok",
    "failed": "fail",
    "error": "fail",
    "deviation": "dev",
    "n/a": "na",
    "unavailable": "un",
}
_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.5em; margin: 0 0 .3em; }
h2 { font-size: 1.15em; margin: 1.6em 0 .5em; }
table { border-collapse: collapse; margin: .4em 0; }
th, td { border: 1px solid #c8c8c8; padding: 2px 6px; text-align: center; }
th { background: #f2f2f2; font-weight: 600; white-space: nowrap; }
td.name, th.name { text-align: left; font-family: ui-monospace, monospace; white-space: nowrap; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
#matrix th.cell { writing-mode: vertical-rl; transform: rotate(180deg); font-weight: 500; white-space: nowrap; }
#matrix td { font-size: 12px; }
.ok { background: #c9e7c5; }
.fail { background: #f2a7a7; font-weight: 600; }
.dev { background: #f6e39d; }
.na { background: #f7f7f7; color: #9a9a9a; }
.un { background: #d7deea; color: #4a5568; }
td.fail a, td.dev a { color: inherit; }
dl { display: grid; grid-template-columns: max-content auto; gap: 2px 14px; margin: .5em 0; }
dt { font-weight: 600; }
dd { margin: 0; }
pre { background: #f6f6f6; padding: .5em; overflow-x: auto; white-space: pre-wrap; }
.legend span { display: inline-block; padding: 0 6px; margin-right: 6px; border: 1px solid #c8c8c8; }
.totals { font-size: 1.05em; }
"""
_LEGEND = [
    ("ok", "ok", "passed"),
    ("fail", "FAIL", "failed or error"),
    ("dev", "dev", "declared deviation"),
    ("un", "--", "unavailable on this machine"),
    ("na", ".", "n/a: the check does not apply, or a feature is not claimed"),
]


def render(document: dict[str, Any]) -> str:
    """The report document (see :mod:`~lightning_optimizer.conformance.report`) as a self-contained HTML page."""
    impl = document["impl"]
    title = f"Conformance: {impl['name']} {impl['version']}"
    problems = report.failing_results(document) + [r for r in document["results"] if r["outcome"] == "deviation"]
    anchors = {id(row): f"why-{i}" for i, row in enumerate(problems, start=1)}
    body = [
        f"<h1>{escape(title)}</h1>",
        *_about(document),
        '<h2 id="summary">Summary</h2>',
        f'<p class="totals">{escape(report.summary_text(document))}</p>',
        *(f"<p>{escape(note)}</p>" for note in report.not_applicable_notes(document)),
        _legend(),
        *_groups(document),
        '<h2 id="cells">Cells</h2>',
        *_cells(document),
        '<h2 id="matrix-heading">Matrix</h2>',
        *matrix_rows(document, anchors),
        *_reasons(problems, anchors),
        *_run_notes(document),
    ]
    return "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            "<head>",
            '<meta charset="utf-8">',
            f"<title>{escape(title)}</title>",
            f"<style>{_STYLE}</style>",
            "</head>",
            "<body>",
            *body,
            "</body>",
            "</html>",
            "",
        ]
    )


def _about(document: dict[str, Any]) -> list[str]:
    impl, claims = document["impl"], document["claims"]
    env: dict[str, Any] = {key: "unknown" for key in ("python", "torch", "torch_xla", "lightning")}
    env["devices_found"] = []
    env |= document.get("env", {})
    facts = [
        ("contract", document["contract_version"]),
        ("module", impl["module"]),
        ("devices", ", ".join(claims.get("devices", []))),
        ("precisions", ", ".join(claims.get("precisions", []))),
        ("world sizes", ", ".join(map(str, claims.get("world_sizes", [])))),
        ("strategies", ", ".join(claims.get("strategies", []))),
        ("features", ", ".join(claims.get("features", [])) or "none"),
        (
            "machine",
            f"Python {env['python']}, torch {env['torch']}, torch_xla {env['torch_xla']}, "
            f"Lightning {env['lightning']}; devices found: {', '.join(env['devices_found'])}",
        ),
    ]
    return ['<dl id="about">', *(f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in facts), "</dl>"]


def _legend() -> str:
    keys = "".join(f'<span class="{css}">{escape(mark)}</span>{escape(text)} ' for css, mark, text in _LEGEND)
    return f'<p class="legend">{keys}</p>'


def _groups(document: dict[str, Any]) -> list[str]:
    """Requirement groups by device and precision, each mark the worst outcome of the group's checks there."""
    columns, marks = report.group_marks(document)
    if not marks:
        return ["<p>No check ran in a cell the implementation claims.</p>"]
    devices: dict[str, int] = {}
    for device, _ in columns:
        devices[device] = devices.get(device, 0) + 1
    lines = [
        '<table id="groups">',
        '<tr><th class="name" rowspan="2">requirements</th>'
        + "".join(f'<th colspan="{n}">{escape(device)}</th>' for device, n in devices.items())
        + "</tr>",
        "<tr>" + "".join(f"<th>{escape(precision)}</th>" for _, precision in columns) + "</tr>",
    ]
    for group, found in marks.items():
        cells = []
        for column in columns:
            outcome = found.get(column)
            if outcome is None:
                cells.append("<td></td>")
            else:
                cells.append(f'<td class="{_CLASS[outcome]}">{escape(report.MARKS[outcome])}</td>')
        lines.append(f'<tr><td class="name">{escape(group)}</td>{"".join(cells)}</tr>')
    return [*lines, "</table>"]


def _cells(document: dict[str, Any]) -> list[str]:
    counted = report.COUNTED
    lines = [
        '<table id="cell-counts">',
        '<tr><th class="name">cell</th>' + "".join(f"<th>{escape(o)}</th>" for o in counted) + "</tr>",
    ]
    hidden = report.n_a_cells(document)
    for column, counts in report.cell_counts(document):
        if column in hidden:
            continue
        numbers = "".join(
            f'<td class="num{" " + _CLASS[o] if counts[o] and o != "passed" else ""}">{counts[o]}</td>' for o in counted
        )
        lines.append(f'<tr><td class="name">{escape(column)}</td>{numbers}</tr>')
    lines.append("</table>")
    if hidden:
        lines.append(f"<p>Cells where no check applies: {escape(report.describe_cells(hidden))}.</p>")
    return lines


def matrix_rows(document: dict[str, Any], anchors: dict[int, str]) -> list[str]:
    columns, rows = report.matrix_rows(document)
    columns, hidden = report.shown_columns(columns, rows)
    if not rows:
        return []
    by_cell = {(row["check"], report.column_of(row)): row for row in document["results"]}
    lines = [
        '<table id="matrix">',
        '<tr><th class="name">check</th><th class="name">requirements</th>'
        + "".join(f'<th class="cell">{escape(column)}</th>' for column in columns)
        + "</tr>",
    ]
    for check, requirements, outcomes in rows:
        cells = []
        for column in columns:
            outcome = outcomes.get(column)
            if outcome is None:
                cells.append("<td></td>")
                continue
            row = by_cell[(check, column)]
            mark = escape(report.MARKS[outcome])
            if id(row) in anchors:
                why = escape(report.one_line(row["reason"]), quote=True)
                cells.append(
                    f'<td class="{_CLASS[outcome]}" title="{why}"><a href="#{anchors[id(row)]}">{mark}</a></td>'
                )
            else:
                shown = row["reason"] and outcome != "n/a"  # n/a reasons repeat by the thousand: the legend says them
                title = f' title="{escape(row["reason"], quote=True)}"' if shown else ""
                cells.append(f'<td class="{_CLASS[outcome]}"{title}>{mark}</td>')
        lines.append(
            f'<tr><td class="name">{escape(check)}</td><td class="name">{escape(requirements)}</td>'
            f"{''.join(cells)}</tr>"
        )
    lines.append("</table>")
    if hidden:
        lines.append(f"<p>Cells that are n/a for every check: {escape(', '.join(hidden))}.</p>")
    return lines


REASON_LINES = 12
"""The most lines of a reason the page shows; the JSON and Markdown reports keep every line."""


def _excerpt(reason: str) -> str:
    lines = reason.rstrip("\n").splitlines()
    if len(lines) <= REASON_LINES:
        return "\n".join(lines)
    more = len(lines) - REASON_LINES
    return "\n".join([*lines[:REASON_LINES], f"... {more} more lines: the JSON and Markdown reports give them all"])


def _reasons(problems: list[dict[str, Any]], anchors: dict[int, str]) -> list[str]:
    if not problems:
        return []
    lines = ['<h2 id="reasons">Failures, errors and deviations</h2>', "<ol>"]
    for row in problems:
        where = "any cell" if row["device"] is None else report.column_of(row)
        observed = row.get("observed", "")
        lines.append(
            f'<li id="{anchors[id(row)]}"><code>{escape(row["check"])}</code> on {escape(where)}: '
            f"<strong>{escape(row['outcome'])}</strong><pre>{escape(_excerpt(row['reason']))}</pre>"
            + (
                f"observed:<pre>{escape(_excerpt(observed))}</pre>"
                if row["outcome"] == "deviation" and observed
                else ""
            )
            + "</li>"
        )
    return [*lines, "</ol>"]


def _run_notes(document: dict[str, Any]) -> list[str]:
    lines = []
    stale = report.stale_entries(document)
    if stale:
        lines += ['<h2 id="stale">Stale expected-failure entries</h2>', "<ul>"]
        lines += [
            f"<li><code>{escape(row['entry'])}</code> ({escape(row['source'])}): {escape(row['why_stale'])}</li>"
            for row in stale
        ]
        lines.append("</ul>")
    if document.get("run_failures"):
        lines += ['<h2 id="run-failed">The run failed</h2>', "<ul>"]
        lines += [f"<li>{escape(failure)}</li>" for failure in document["run_failures"]]
        lines.append("</ul>")
    return lines
