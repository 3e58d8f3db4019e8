"""The HTML report (``--report-html``): one self-contained page that a real browser renders.

The page is built here from results that cover every outcome, with a reason that holds markup. Its text is read
back with the standard library's HTML parser; where Chromium is installed, headless Chromium loads the file with
the network closed, its DOM is read back, and a screenshot shows the outcome colours.
"""

from __future__ import annotations

import dataclasses
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from matplotlib import image

from lightning_optimizer.conformance import html_report, report
from lightning_optimizer.conformance.report import Declaration, Result
from lightning_optimizer.reference import conformance_info as reference_info

CHROMIUM = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
NO_CHROMIUM = (
    "unavailable here: no Chromium on PATH (make env installs Debian's chromium where it runs as root with apt-get)"
)
# A hang guard, never a speed check: each Chromium run took under 2 s on 2 cores beside other jobs (load 3.5); 120 s is
# 60 times that.
TIMEOUT_S = 120
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
MARKUP = "AssertionError: got <script>alert('x')</script> & \"more\""
"""A failure's reason with markup in it: the page must show it as text."""
COLOURS = {"ok": (0xC9, 0xE7, 0xC5), "fail": (0xF2, 0xA7, 0xA7), "dev": (0xF6, 0xE3, 0x9D), "un": (0xD7, 0xDE, 0xEA)}
"""The background of a passed, failed, deviating and unavailable cell (the page's style)."""

INFO = dataclasses.replace(reference_info(), devices=frozenset({"cpu", "cuda"}), precisions=frozenset({"32-true"}))


def _document() -> dict[str, Any]:
    def at(check: str, requirement: str, outcome: str, device: str | None, reason: str = "", **kw: Any) -> Result:
        precision, world_size, strategy = ("32-true", 1, "none") if device else (None, None, None)
        return Result(
            check, [requirement], device, precision, world_size, strategy, outcome=outcome, reason=reason, **kw
        )

    results = [
        at("test_step_once", "STEP-001", "passed", "cpu"),
        at("test_step_once", "STEP-001", "unavailable", "cuda", "no CUDA device"),
        at("test_accumulates", "ACC-001", "failed", "cpu", MARKUP + "\nassert 1 == 2"),
        at("test_accumulates", "ACC-001", "unavailable", "cuda", "no CUDA device"),
        at("test_declared", "AMP-002", "deviation", "cpu", "declared: no AMP", observed="AssertionError: no scaler"),
        at("test_declared", "AMP-002", "unavailable", "cuda", "no CUDA device"),
        at("test_not_here", "XLA-001", "n/a", "cpu", "the check does not apply to cpu 32-true"),
        at("test_static_surface", "SURFACE-003", "passed", None),
    ]
    stale = Declaration("test_gone", "old", "file.txt:1", stale=True, why_stale="no check named test_gone")
    return report.build(INFO, "my_impl", results, declarations=[stale], run_failures=["a required device ran nothing"])


class _Page(HTMLParser):
    """The parts of a page the tests look at: element ids, table cells by table, link targets, titles, text."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.tables: dict[str, list[list[tuple[str, str, str]]]] = {}
        self.hrefs: list[str] = []
        self.text: list[str] = []
        self.tags: set[str] = set()
        self._table: str | None = None
        self._cell: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        self.tags.add(tag)
        if "id" in values:
            self.ids.add(values["id"])
        if tag == "table":
            self._table = values.get("id", "")
            self.tables[self._table] = []
        elif tag == "tr" and self._table is not None:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = [values.get("class", ""), values.get("title", ""), ""]
        elif tag == "a":
            self.hrefs.append(values.get("href", ""))

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table is not None:
            css, title, text = self._cell
            self.tables[self._table][-1].append((css, title, text.strip()))
            self._cell = None
        elif tag == "table":
            self._table = None

    def handle_data(self, data: str) -> None:
        self.text.append(data)
        if self._cell is not None:
            self._cell[2] += data


def _parsed(page: str) -> _Page:
    parser = _Page()
    parser.feed(page)
    parser.close()
    return parser


def _assert_report_page(page: _Page) -> None:
    """The matrix, the summaries and the reasons of :func:`_document`, as a reader finds them on the page."""
    assert {"summary", "groups", "cell-counts", "matrix", "reasons", "stale", "run-failed", "about"} <= page.ids
    header, *rows = page.tables["matrix"]
    assert [text for _, _, text in header] == ["check", "requirements", "any", "cpu/32-true/ws1", "cuda/32-true/ws1"]
    cells = {row[0][2]: row[3:] for row in rows}  # the cpu and cuda cells
    anywhere = {row[0][2]: row[2][2] for row in rows}
    assert anywhere == dict.fromkeys(cells, "") | {"test_static_surface": "ok"}, "a check without a cell: any"
    assert cells["test_step_once"] == [("ok", "", "ok"), ("un", "no CUDA device", "--")]
    (css, title, text), _ = cells["test_accumulates"]
    assert (css, text) == ("fail", "FAIL") and title == report.one_line(MARKUP), title
    assert cells["test_declared"][0][:2] == ("dev", "declared: no AMP")
    assert cells["test_not_here"][0][0] == "na"
    assert "#why-1" in page.hrefs and "why-1" in page.ids, "a failing cell links to its reason in full"
    text = "".join(page.text)
    assert MARKUP + "\nassert 1 == 2" in text, "the reason in full, its markup as text"
    assert "1 passed" not in text and "2 passed" in text and "1 failed" in text and "3 unavailable" in text
    groups = {row[0][2]: [cell[2] for cell in row[1:]] for row in page.tables["groups"][2:]}
    assert groups == {
        "ACC": ["FAIL", "--", ""],
        "AMP": ["dev", "--", ""],
        "STEP": ["ok", "--", ""],
        "SURFACE": ["", "", "ok"],
        "XLA": [".", "", ""],
    }
    counts = {row[0][2]: [cell[2] for cell in row[1:]] for row in page.tables["cell-counts"][1:]}
    assert counts["cpu/32-true/ws1"] == ["1", "1", "0", "1", "1", "0"]
    assert counts["cuda/32-true/ws1"] == ["0", "0", "0", "0", "0", "3"]
    assert "no check named test_gone" in text and "a required device ran nothing" in text
    assert "torch" in text and "my_impl" in text and "closure_evaluating_optimizers" in text


def test_page_is_self_contained_and_escapes_every_text(tmp_path: Path) -> None:
    page = html_report.render(_document())
    lowered = page.lower()
    for outside in ("<script", "http://", "https://", " src=", "@import", "url(", "<link"):
        assert outside not in lowered, f"the page reaches outside itself: {outside}"
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; &quot;more&quot;" in page
    _assert_report_page(_parsed(page))


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
def test_chromium_renders_the_matrix_and_its_colours(tmp_path: Path) -> None:
    """Headless Chromium loads the file with no network; its DOM holds the tables; its screenshot, the colours."""
    assert CHROMIUM is not None
    path = tmp_path / "report.html"
    path.write_text(html_report.render(_document()), encoding="utf-8")
    browser = [CHROMIUM, *FLAGS, f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run([*browser, "--dump-dom", path.as_uri()], capture_output=True, text=True, timeout=TIMEOUT_S)
    assert dom.returncode == 0, dom.stderr[-3000:]
    _assert_report_page(_parsed(dom.stdout))
    shot = tmp_path / "report.png"
    taken = subprocess.run(
        [*browser, "--window-size=1200,1400", f"--screenshot={shot}", path.as_uri()],
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )
    assert taken.returncode == 0 and shot.is_file(), taken.stderr[-3000:]
    pixels = (image.imread(shot)[..., :3] * 255).round().astype(int)
    for name, colour in COLOURS.items():
        seen = (abs(pixels - colour).max(axis=-1) <= 2).sum()
        assert seen > 200, f"no {name} cell on the rendered page ({seen} pixels of {colour})"
