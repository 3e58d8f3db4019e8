"""The reports of the conformance suite as a framework author reads them.

The terminal matrix gives each failed cell its reason on one line; a declared deviation keeps the failure it
showed beside the declared reason; the JSON report leaves out the n/a results of unclaimed cells and counts them;
the Markdown page puts long reasons in collapsed code blocks and escapes ``|`` in its table.

Two runs of the real suite against ``tests/plugin_impls/broken_wrapper.py`` (a few surface checks, CPU cells),
in one subprocess (``plugin_impls.run_many``); the rest renders documents built here.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lightning_optimizer.conformance import report
from lightning_optimizer.conformance.report import OUTCOMES, REASON_LINES, REASON_WIDTH, TERMINAL_WIDTH, Result
from lightning_optimizer.conformance.selection import WORLD_SIZES
from lightning_optimizer.reference import conformance_info as reference_info
from lightning_optimizer.spec import PRECISIONS

REPO = Path(__file__).resolve().parents[1]
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")
# A hang guard, never a speed check: the batch of suite runs here took 9 s on 2 cores beside other jobs (load 3.5);
# 600 s is 69 times that.
TIMEOUT_S = 600
DECLARED = "the wrapper has no backward; call loss.backward() instead"
"""The reason ``plugin_impls.broken_wrapper:declared_info`` declares."""
FAILURE = "NoBackwardWrapper does not match OptimizerWrapper: backward: missing"
"""The first line of the wrapper-surface check's failure on ``plugin_impls.broken_wrapper``."""
CHECKS = "wrapper_surface or context_surface or copies_continue_independently"
CASES: dict[str, list[str]] = {
    # claims cpu/32-true/ws1 only: 64-true is selected but not claimed; the copy checks need pickling
    "failing": ["--impl=plugin_impls.broken_wrapper", "-k", CHECKS, "--precisions=32-true,64-true"],
    "deviation": ["--impl=plugin_impls.broken_wrapper:declared_info", "-k", "wrapper_surface", "--precisions=32-true"],
}


@dataclasses.dataclass
class Reported:
    """One run of the suite: its exit status, terminal output and both reports."""

    exit: int
    stdout: str
    document: dict[str, Any]
    markdown: str

    def matrix(self) -> list[str]:
        """The lines of the terminal's conformance matrix section."""
        assert "conformance matrix" in self.stdout, self.stdout[-4000:]
        return self.stdout[self.stdout.index("conformance matrix") :].splitlines()


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Reported]:
    """Every case of ``CASES`` on CPU at world size 1, with ``--report-json`` and ``--report-md``."""
    folder = tmp_path_factory.mktemp("reports")
    cases = {
        case: {
            "args": [
                *args,
                "--devices=cpu",
                "--world-sizes=1",
                f"--report-json={folder / f'{case}.json'}",
                f"--report-md={folder / f'{case}.md'}",
            ]
        }
        for case, args in CASES.items()
    }
    (folder / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO / "tests"), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "plugin_impls.run_many", str(folder / "cases.json"), str(folder / "out.json")]
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert (folder / "out.json").is_file(), done.stdout[-4000:] + done.stderr[-4000:]
    outputs = json.loads((folder / "out.json").read_text(encoding="utf-8"))
    reported = {}
    for case in CASES:
        got = outputs[case]
        assert (folder / f"{case}.json").is_file(), got["stdout"][-4000:] + got["stderr"][-2000:]
        document = json.loads((folder / f"{case}.json").read_text(encoding="utf-8"))
        markdown = (folder / f"{case}.md").read_text(encoding="utf-8")
        reported[case] = Reported(got["exit"], got["stdout"], document, markdown)
    return reported


def _rows(document: dict[str, Any], check: str) -> list[dict[str, Any]]:
    return [row for row in document["results"] if row["check"] == check]


# -- the runs ------------------------------------------------------------------------------------------


def test_terminal_gives_each_failing_cell_its_reason(runs: dict[str, Reported]) -> None:
    got = runs["failing"]
    assert got.exit == 1, got.stdout[-4000:]
    matrix = got.matrix()
    assert "why (1 failed or erroring cell; the first line of each failure):" in matrix
    line = f"  FAIL test_wrapper_surface (cpu/32-true/ws1): {FAILURE}"
    assert line in matrix, "\n".join(matrix)
    assert not [text for text in matrix if "test_context_surface (" in text], "a passing cell got a reason line"
    assert matrix.index(line) > next(i for i, text in enumerate(matrix) if text.startswith("summary: "))


def test_json_leaves_out_unclaimed_cells_and_counts_them(runs: dict[str, Reported]) -> None:
    """64-true is selected but not claimed: its n/a results are counted, not listed; n/a ones in 32-true stay."""
    got = runs["failing"]
    document = got.document
    assert document["schema_version"] == 3
    assert {row["precision"] for row in document["results"]} == {"32-true"}
    checks = {row["check"] for row in document["results"]}
    copies = {"test_copies_continue_independently[deepcopy]", "test_copies_continue_independently[pickle]"}
    assert checks == {"test_wrapper_surface", "test_context_surface", *copies}
    for check in copies:  # n/a inside a claimed cell, for a reason of its own: listed
        [row] = _rows(document, check)
        assert (row["outcome"], row["reason"]) == ("n/a", "not claimed (feature pickling)")
    summary = document["summary"]
    assert summary["n/a_left_out"] == len(checks)  # each check's one 64-true cell
    assert document["left_out"]["cells"] == ["cpu/64-true/ws1"]
    assert "not claimed" in document["left_out"]["why"]
    for outcome in OUTCOMES:
        assert summary[outcome] == sum(row["outcome"] == outcome for row in document["results"]), outcome
    assert (summary["failed"], summary["passed"], summary["n/a"]) == (1, 1, 2)
    matrix = got.matrix()
    assert (
        "n/a, deselected: 6 (4 in cells not claimed, left out of the reports (cpu/ws1: 64-true); 2 not claimed "
        "(feature pickling))"
    ) in " ".join(line.strip() for line in matrix)
    assert not [line for line in matrix if "cpu/64-true/ws1" in line], "an unclaimed cell is in the matrix"
    assert "Cells not claimed, left out of the report (4 n/a results): cpu/ws1: 64-true." in got.markdown


def test_deviation_keeps_the_observed_failure_beside_the_declared_reason(runs: dict[str, Reported]) -> None:
    got = runs["deviation"]
    assert got.exit == 0, got.stdout[-4000:]
    [row] = _rows(got.document, "test_wrapper_surface")
    assert (row["outcome"], row["reason"]) == ("deviation", DECLARED)
    assert row["observed"].startswith(f"AssertionError: {FAILURE}\n"), row
    bullet = next(line for line in got.markdown.splitlines() if line.startswith("- `test_wrapper_surface`"))
    assert bullet == f"- `test_wrapper_surface` on cpu/32-true/ws1: **deviation**: {DECLARED}; observed: {FAILURE}"
    assert "<details><summary>observed failure (2 lines)</summary>" in got.markdown
    [failed] = _rows(runs["failing"].document, "test_wrapper_surface")
    assert failed["observed"] == "", "only a deviation has an observed failure besides its reason"


def test_markdown_puts_a_multi_line_failure_in_a_details_block(runs: dict[str, Reported]) -> None:
    lines = runs["failing"].markdown.splitlines()
    bullet = lines.index(f"- `test_wrapper_surface` on cpu/32-true/ws1: **failed**: {FAILURE}")
    assert lines[bullet + 1 : bullet + 9] == [
        "",
        "  <details><summary>full message (2 lines)</summary>",
        "",
        "  ```text",
        f"  AssertionError: {FAILURE}",
        "  assert not ['backward: missing']",
        "  ```",
        "",
    ]
    assert lines[bullet + 9] == "  </details>"


# -- the renderers -------------------------------------------------------------------------------------

INFO = dataclasses.replace(
    reference_info(), devices=frozenset({"cpu"}), precisions=frozenset({"32-true"}), world_sizes=frozenset({1})
)
"""The reference, claiming cpu/32-true/ws1 only."""


def _result(check: str, outcome: str, reason: str = "", precision: str | None = "32-true", **kw: Any) -> Result:
    device, world_size = ("cpu", 1) if precision is not None else (None, None)
    return Result(check, ["SURFACE-001"], device, precision, world_size, outcome=outcome, reason=reason, **kw)


HYPOTHESIS_REASON = "\n".join(
    [
        "AssertionError: the window stepped at the wrong call | expected S, got A",
        "assert 'accumulated' == 'stepped'",
        "Falsifying example: test_generated_schedules(",
        *(f"    call_{i}=```{i}```," for i in range(134)),
        ")",
        "",
        "You can reproduce this example by temporarily adding @reproduce_failure('6.1', b'AAE=') as a decorator",
    ]
)
"""A failure of a property-based check: 140 lines, with ``|`` and backticks in them."""


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (f"AssertionError: {FAILURE}\nassert not ['backward: missing']", FAILURE),
        (
            "TypeError: step() got an unexpected keyword argument 'closure_evaluating_optimizer'",
            "TypeError: step() got an unexpected keyword argument 'closure_evaluat...",
        ),
        ("\n\n  RuntimeError:\n   the device is gone\nmore", "RuntimeError: the device is gone"),
        (
            "AssertionError: Call(optimizer=1, make_optimizer_step=False, form='closure', set_to_none=True): the "
            "gradient of heads.1.weight differs from the oracle's\nFalsifying example: ...",
            "Call(...): the gradient of heads.1.weight differs from the oracle's",
        ),
        ("AssertionError", "AssertionError"),
        ("", "(no message)"),
    ],
    ids=["assertion-message", "cut-at-width", "type-on-a-line-alone", "long-brackets-first", "bare-type", "empty"],
)
def test_one_line_is_the_first_meaningful_line_cut_to_width(reason: str, expected: str) -> None:
    assert report.one_line(reason, width=72) == expected


def test_build_leaves_out_only_the_n_a_results_of_unclaimed_cells() -> None:
    results = [
        _result("test_a", "passed"),
        _result("test_b", "n/a", "the check does not apply to cpu 32-true"),
        _result("test_a", "n/a", "not claimed (precision 64-true)", precision="64-true"),
        _result("test_c", "failed", "boom", precision="64-true"),  # not n/a: never hidden
        _result("test_static", "n/a", "needs the record", precision=None),
    ]
    document = report.build(INFO, "m", results)
    kept = [(row["check"], row["precision"]) for row in document["results"]]
    assert kept == [("test_a", "32-true"), ("test_b", "32-true"), ("test_c", "64-true"), ("test_static", None)]
    assert document["summary"] == {
        **dict.fromkeys(OUTCOMES, 0),
        "passed": 1,
        "failed": 1,
        "n/a": 2,
        "n/a_left_out": 1,
    }
    assert document["left_out"]["cells"] == ["cpu/64-true/ws1"]
    assert document["left_out"]["checks"] == ["test_a"]
    assert all(row["observed"] == "" for row in document["results"])
    json.loads(report.to_json(document))


def test_terminal_reasons_are_one_line_each_and_bounded() -> None:
    extra = 5
    results = [_result(f"test_{i:02}", "failed", f"AssertionError: {'x' * 300}\nmore") for i in range(REASON_LINES)]
    results += [_result(f"test_{REASON_LINES + i:02}", "error", "ValueError: late") for i in range(extra)]
    lines = report.render_terminal(report.build(INFO, "m", results))
    start = lines.index(f"why ({REASON_LINES + extra} failed or erroring cells; the first line of each failure):")
    reasons = lines[start + 1 :]
    assert len(reasons) == REASON_LINES + 1, reasons
    assert reasons[0].startswith("  FAIL test_00 (cpu/32-true/ws1): xxx") and reasons[0].endswith("...")
    assert all(len(line) <= TERMINAL_WIDTH for line in reasons[:-1])
    assert reasons[-1] == (
        f"  ... and {extra} more: the reports (--report-json, --report-md, --report-html) give every reason in full"
    )


def _cells(table_row: str) -> list[str]:
    """A Markdown table row's cells, split where GitHub splits them: at each ``|`` not escaped."""
    return re.split(r"(?<!\\)\|", table_row.strip())[1:-1]


def test_markdown_renders_long_reasons_in_collapsed_code_blocks() -> None:
    results = [
        _result("test_generated_schedules", "failed", HYPOTHESIS_REASON),
        _result("test_pipe[a|b]", "failed", "AssertionError: got <StepOutcome.stepped: 'stepped'> | *not* __init__"),
        _result("test_declared", "deviation", DECLARED, observed=HYPOTHESIS_REASON),
        _result("test_long", "error", "ValueError: " + "y" * 200),
    ]
    markdown = report.to_markdown(report.build(INFO, "m", results))
    lines = markdown.splitlines()
    header = next(line for line in lines if line.startswith("| check |"))
    for row in (line for line in lines if line.startswith("| `")):
        assert len(_cells(row)) == len(_cells(header)), row
    assert "| `test_pipe[a\\|b]` | SURFACE-001 | failed |" in lines
    assert (
        "- `test_pipe[a|b]` on cpu/32-true/ws1: **failed**: got \\<StepOutcome.stepped: 'stepped'\\> \\| \\*not\\* "
        "\\_\\_init\\_\\_"
    ) in lines
    bullet = next(i for i, line in enumerate(lines) if line.startswith("- `test_generated_schedules`"))
    assert lines[bullet].endswith(": **failed**: the window stepped at the wrong call \\| expected S, got A")
    assert lines[bullet + 2] == "  <details><summary>full message (140 lines)</summary>"
    assert lines[bullet + 4] == "  ````text", "the fence is longer than the backtick runs of the reason"
    close = lines.index("  ````", bullet)
    assert close - bullet - 5 == len(HYPOTHESIS_REASON.splitlines())
    assert all(line.startswith("  ") or not line for line in lines[bullet + 1 : close + 4]), "a line left the list item"
    assert lines[close + 1 : close + 4] == ["", "  </details>", ""]
    deviation = next(line for line in lines if line.startswith("- `test_declared`"))
    assert deviation.endswith(
        f"**deviation**: {DECLARED}; observed: the window stepped at the wrong call \\| expected S, got A"
    )
    assert "<summary>observed failure (140 lines)</summary>" in markdown
    long = lines.index(f"- `test_long` on cpu/32-true/ws1: **error**: ValueError: {'y' * (REASON_WIDTH - 15)}...")
    assert lines[long + 2] == "  <details><summary>full message (1 line)</summary>"
    assert markdown.count("<details>") == markdown.count("</details>") == 3


def test_cells_are_described_in_short() -> None:
    every = [f"cpu/{precision}/ws{world}" for precision in PRECISIONS for world in WORLD_SIZES]
    assert report.describe_cells(every) == "cpu/ws1; cpu/ws2"
    sharded = [f"cpu/{precision}/ws2-fsdp" for precision in PRECISIONS]
    assert report.describe_cells([*every, *sharded]) == "cpu"
    assert report.describe_cells(sharded[:2]) == f"cpu/ws2-fsdp: {', '.join(PRECISIONS[:2])}"
    some = ["xla/bf16-true/ws1", *every[1:], "xla/64-true/ws1"]
    assert report.describe_cells(some) == f"cpu/ws1: {', '.join(PRECISIONS[1:])}; cpu/ws2; xla/ws1: 64-true, bf16-true"


# -- the terminal summary ------------------------------------------------------------------------------

EVERY_CELL = dataclasses.replace(reference_info(), devices=frozenset({"cpu", "xla"}))
"""The reference, claiming every cell of cpu and xla (not cuda)."""


def _at(check: str, requirement: str, outcome: str, cell: str | None, reason: str = "") -> Result:
    if cell is None:
        return Result(check, [requirement], None, None, None, outcome=outcome, reason=reason)
    device, precision, world = cell.split("/")
    size, _, strategy = world.removeprefix("ws").partition("-")
    return Result(
        check,
        [requirement],
        device,
        precision,
        int(size),
        strategy or ("none" if size == "1" else "ddp"),
        outcome=outcome,
        reason=reason,
    )


def _summary_document() -> dict[str, Any]:
    """Two groups over cpu and xla at every world size, every outcome somewhere, long names and reasons."""
    long_check = "test_" + "a_very_long_check_name_" * 6 + "[with-parameters-" + "x" * 60 + "]"
    results = []
    for device in ("cpu", "xla"):
        for precision in PRECISIONS:
            for world in ("ws1", "ws2", "ws2-fsdp"):
                cell = f"{device}/{precision}/{world}"
                ok = "passed" if world == "ws1" else "n/a"
                results.append(_at("test_plain", "STEP-001", ok, cell, "" if ok == "passed" else "does not apply"))
                results.append(_at(long_check, "ACC-002", "passed", cell))
    results[0] = _at("test_plain", "STEP-001", "failed", "cpu/64-true/ws1", "AssertionError: " + "why " * 80)
    results[3] = _at(long_check, "ACC-002", "deviation", "cpu/64-true/ws2", "declared")
    results.append(_at("test_on_xla_only", "XLA-001", "unavailable", "xla/32-true/ws1", "no torch_xla here"))
    results.append(_at("test_static", "SURFACE-003", "passed", None))
    return report.build(EVERY_CELL, "m", results)


def test_terminal_summary_fits_120_columns_and_counts_each_cell() -> None:
    """One row per cell with each outcome counted; one row per requirement group; nothing wider than 120."""
    document = _summary_document()
    lines = report.render_terminal(document)
    assert all(len(line) <= TERMINAL_WIDTH for line in lines), max(lines, key=len)
    heading = lines.index(next(line for line in lines if line.startswith("cell ")))
    assert lines[heading].split() == ["cell", "passed", "failed", "error", "deviation", "n/a", "unavailable"]
    table = {}
    for line in lines[heading + 1 :]:
        if not line.strip():
            break
        cell, *numbers = line.split()
        table[cell] = [int(n) for n in numbers]
    assert table["cpu/64-true/ws1"] == [1, 1, 0, 0, 0, 0]
    assert table["cpu/64-true/ws2"] == [0, 0, 0, 1, 1, 0]
    assert table["xla/32-true/ws1"] == [2, 0, 0, 0, 0, 1]
    assert table["cpu/bf16-true/ws2-fsdp"] == [1, 0, 0, 0, 1, 0]
    assert table["any"] == [1, 0, 0, 0, 0, 0]
    assert len(table) == 2 * len(PRECISIONS) * 3 + 1
    assert (
        [line for line in lines if "test_plain" in line]
        == [  # the reason line; the matrix only on request
            "  FAIL test_plain (cpu/64-true/ws1): " + ("why " * 80)[: TERMINAL_WIDTH - 40].rstrip() + "..."
        ]
    )


def test_terminal_summary_marks_each_group_by_its_worst_outcome() -> None:
    lines = report.render_terminal(_summary_document())
    top = next(i for i, line in enumerate(lines) if line.startswith("requirements "))
    assert lines[top].split() == ["requirements", "cpu", "xla", "any"]
    assert lines[top + 1].split() == ["64", "32", "16m", "b16m", "b16t", "16t"] * 2
    rows = {line.split()[0]: line.split()[1:] for line in lines[top + 2 :] if line and not line.startswith(" ")}
    assert rows["ACC"] == ["dev", *["ok"] * 11]
    assert rows["STEP"] == ["FAIL", *["ok"] * 11]
    assert rows["SURFACE"] == ["ok"]
    xla = lines[top + 2 :][list(rows).index("XLA")]
    assert xla.split() == ["XLA", "--"]
    column = lines[top + 1].index("32", lines[top + 1].index("16t"))  # xla's 32-true column
    assert xla.index("--") == column


def test_full_matrix_is_printed_on_request() -> None:
    document = _summary_document()
    lines = report.render_terminal(document, matrix="full")
    assert any(line.startswith("test_plain ") and "FAIL" in line for line in lines)
    assert lines[len(report.render_terminal(document, matrix="full")) - len(report.render_terminal(document)) :] == (
        report.render_terminal(document)
    )
    with pytest.raises(ValueError, match="matrix must be one of summary, full, not 'wide'"):
        report.render_terminal(document, matrix="wide")
