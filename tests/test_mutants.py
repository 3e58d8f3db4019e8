"""Meta-tests of the conformance suite: each check catches a deliberately broken implementation.

Every module of ``tests/mutants/<family>/`` (importable as ``mutants.<family>.<name>`` with
``PYTHONPATH=<repo>/tests``) is the reference with one rule of the contract broken the way a real framework breaks
it, in the folder of its requirement's family (``STEP-001``: ``step/``). Each declares ``MUTANT = Mutant(...)``
(``mutants._declared``): the requirement it breaks, the checks that must catch it, the cells they run on
(cpu/32-true/ws1 unless it says otherwise), the blind batch that wrote it, if one did, and a known gap of its
checks, if any. The declarations are read from the modules' source, not imported, so collecting these tests imports
no mutant (and no torch_xla, which some of them need to run). The real suite runs against each mutant on its cells
and only for the checks it names, and every one of those must report ``failed`` for a reason tied to its
requirement. The mutants' unbroken base (``mutants._base``) must pass those checks on every cell that the mutants
use, and the reference every check on the default cell (``make conformance`` runs it on every cell); every check the
suite collects must catch at least one mutant. A mutant that declares a ``known_gap`` is one its checks do not catch
yet (a defect of those checks): it xfails until the checks are fixed.

The runs are ``pytest conformance ...`` sessions grouped into two batches (``mutants._batch``: one interpreter
per batch, so torch is imported twice, not once per mutant), run side by side and cached for the session. A
mutant that needs what this machine lacks (torch_xla for the xla cells) or has (torch_xla, where the check is of
its absence) is skipped as ``unavailable here``.

``--mutation-report=PATH`` (``tests/conftest.py``; ``make mutation``) writes every mutant's verdict, the checks
that caught it and the kill rate per requirement group (and of the blind batches' mutants) as JSON, prints the
table, and fails the run when any mutant survives.
"""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mutants import _declared
from mutants._declared import BLIND_BATCHES, DEFAULT, PROPERTY_CHECKS, Cells, Mutant

from lightning_optimizer.spec import REQUIREMENTS, requirement_group

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
MUTANT_DIR = TESTS / "mutants"
PLUMBING = ("__init__", "_base", "_batch", "_declared")
"""The modules of ``tests/mutants`` itself: the package, the mutants' base, the batch runner, the declarations."""
REFERENCE = "lightning_optimizer.reference"
CONTROL = "mutants._base"
LANES = 2
BATCH_TIMEOUT_S = 3600
"""A hang guard for one lane's batch, never a speed check: a lane takes about 8 minutes on 2 quiet cores and ran past
15 minutes beside a fresh clone's `make test`, two CPU-bound processes and another suite (load 7); an hour is four
times that."""
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")

CELL_LESS = ("test_static_surface", "test_xla_without_torch_xla_names_it")
"""The checks that take no cell: they run in every session, so only the runs on the default cell keep them."""


def _mutant_name(path: Path) -> str:
    """``amp.unscaled_twice`` for ``tests/mutants/amp/unscaled_twice.py``: the module's name under ``mutants``."""
    return ".".join(path.relative_to(MUTANT_DIR).with_suffix("").parts)


def _mutant_paths() -> list[Path]:
    """Every mutant module: each module under ``tests/mutants`` but the plumbing and the packages' own files."""
    return sorted(
        path for path in MUTANT_DIR.rglob("*.py") if not path.name.startswith("_") and "__pycache__" not in path.parts
    )


def _read_declaration(path: Path) -> Mutant:
    """The module's ``MUTANT = Mutant(...)``, read from its source and evaluated against ``mutants._declared``.

    The module is not imported (some mutants need torch_xla to run, none to be declared): its declaration may use
    only the names that ``mutants._declared`` defines, and the module must assign ``MUTANT`` once, at its top level.
    """
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    values = [
        node.value
        for node in tree.body
        if (isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "MUTANT" for t in node.targets))
        or (isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "MUTANT")
    ]
    value = values[0] if len(values) == 1 else None
    if value is None:
        raise ValueError(f"assigns MUTANT {len(values)} times at its top level, not once")
    names = set(_declared.__all__)
    unknown = {node.id for node in ast.walk(value) if isinstance(node, ast.Name)} - names
    if unknown:
        raise ValueError(f"its MUTANT uses names that mutants._declared does not define: {sorted(unknown)}")
    namespace: dict[str, Any] = {name: getattr(_declared, name) for name in names} | {"__builtins__": {}}
    declared = eval(compile(ast.Expression(value), str(path), "eval"), namespace)
    if not isinstance(declared, Mutant):
        raise TypeError(f"its MUTANT is a {type(declared).__name__}, not a Mutant")
    return declared


def _declarations() -> tuple[dict[str, Mutant], dict[str, str]]:
    """Every mutant's declaration by name, and why each module whose declaration cannot be read has none."""
    mutants: dict[str, Mutant] = {}
    unreadable: dict[str, str] = {}
    for path in _mutant_paths():
        try:
            mutants[_mutant_name(path)] = _read_declaration(path)
        except (SyntaxError, ValueError, TypeError, NameError) as exc:
            unreadable[_mutant_name(path)] = f"{type(exc).__name__}: {exc}"
    return mutants, unreadable


MUTANTS, UNREADABLE = _declarations()
"""The mutants by name (``amp.unscaled_twice``: the module ``mutants.amp.unscaled_twice``), as each declares itself."""

KNOWN_GAPS = {name: mutant.known_gap for name, mutant in MUTANTS.items() if mutant.known_gap is not None}
"""The mutants whose checks do not catch them yet, and why (their ``known_gap``)."""

# Rough seconds per run, to split the runs evenly between the lanes: a full run on the default cell, on another
# cell, on xla; and what a run of a few checks adds for the static check, a fresh process, a pool of DDP ranks.
_FULL_RUN_S, _CELL_RUN_S, _XLA_RUN_S = 35.0, 12.0, 35.0
_STATIC_S, _FRESH_PROCESS_S, _POOL_S, _RUN_S, _PROPERTY_S = 6.0, 8.0, 10.0, 1.0, 3.0


def _base_name(check: str) -> str:
    return check.partition("[")[0]


def _runnable() -> dict[str, Mutant]:
    """The mutants that this machine can run."""
    return {name: mutant for name, mutant in MUTANTS.items() if mutant.cells.unavailable() is None}


def _named_checks(mutants: Iterable[Mutant] = MUTANTS.values()) -> set[str]:
    """The checks (function names) that ``mutants`` name."""
    return {_base_name(check) for mutant in mutants for check in mutant.checks}


def _cells_of(mutants: Iterable[Mutant]) -> list[Cells]:
    """The single cells that ``mutants`` run on, the default cell first."""
    cells = {cell for mutant in mutants for cell in mutant.cells.single()} | {DEFAULT}
    return sorted(cells, key=lambda cell: (cell != DEFAULT, cell.id))


REFERENCE_CELLS = _cells_of(MUTANTS.values())
"""Every cell the mutants use: the control runs on each (that this machine can run), the reference on the default."""


@dataclass(frozen=True)
class Case:
    """One run of the suite: an implementation, its cells and the checks it runs (``-k``; all when empty)."""

    id: str
    impl: str
    where: Cells = DEFAULT
    selection: str = ""
    full: bool = False

    def args(self, out: Path, cache: Path) -> list[str]:
        """The suite's arguments, writing its report and temporary files under ``out``, pytest's cache at ``cache``.

        The cache (one per lane) keeps the static check's mypy cache warm from one run to the next.
        """
        selection = ["-k", self.selection] if self.selection else []
        files = [
            f"--report-json={out / 'report.json'}",
            f"--basetemp={out / 'tmp'}",
            f"--override-ini=cache_dir={cache}",
        ]
        return [f"--impl={self.impl}", *self.where.filters, *selection, *files, "-q"]

    @property
    def xla(self) -> bool:
        return "xla" in self.where.devices.split(",")

    @property
    def cost(self) -> float:
        pool = _POOL_S * (self.where.world_sizes != "1")
        if self.full:
            return _FULL_RUN_S if self.where == DEFAULT else _XLA_RUN_S if self.xla else _CELL_RUN_S + pool
        return (
            _RUN_S
            + _STATIC_S * ("test_static_surface" in self.selection)
            + _FRESH_PROCESS_S * ("test_resume_in_a_fresh_process" in self.selection)
            + _PROPERTY_S * sum(check in self.selection for check in PROPERTY_CHECKS)
            + pool
        )


def _select(checks: Iterable[str]) -> str:
    return " or ".join(sorted({_base_name(check) for check in checks}))


def _reference_id(impl: str, cell: Cells) -> str:
    return f"{impl}@{cell.id}"


def _cases() -> dict[str, Case]:
    cases: dict[str, Case] = {}
    for name, mutant in MUTANTS.items():
        cases[name] = Case(name, f"mutants.{name}", mutant.cells, _select(mutant.checks))
    # The reference runs the whole suite on the default cell (every check, n/a elsewhere: the list of checks);
    # on every other cell `make conformance` runs it whole, so the mutants' cells do not run it again here.
    cases[_reference_id(REFERENCE, DEFAULT)] = Case(_reference_id(REFERENCE, DEFAULT), REFERENCE, DEFAULT, full=True)
    for cell in REFERENCE_CELLS:
        # Off the default cell the control runs the checks of the mutants there: enough to show that each of
        # their failures is their defect.
        there = [mutant for mutant in MUTANTS.values() if cell in mutant.cells.single()]
        control = "" if cell == DEFAULT else _select(check for mutant in there for check in mutant.checks)
        cases[_reference_id(CONTROL, cell)] = Case(
            _reference_id(CONTROL, cell), CONTROL, cell, control, full=cell == DEFAULT
        )
    return cases


CASES = _cases()


@dataclass(frozen=True, repr=False)
class Run:
    """What one case left: its exit status (``None`` if its batch died first), output and report."""

    case: Case
    exit: int | None
    output: str
    document: dict[str, Any] | None

    def __repr__(self) -> str:
        return f"Run({self.case.id}, exit={self.exit})"

    def explain(self) -> str:
        return (
            f"--impl={self.case.impl} {' '.join(self.case.where.filters)}: exit {self.exit}\n--- output (tail)\n"
            + (self.output[-6000:])
        )

    def rows(self, check: str, cell: Cells | None = None) -> list[dict[str, Any]]:
        """The report's rows of ``check`` (a function name: all its rows; ``name[params]``: that row), of ``cell``."""
        assert self.document is not None, self.explain()
        exact = "[" in check
        return [
            row
            for row in self.document["results"]
            if (row["check"] if exact else _base_name(row["check"])) == check and (cell is None or cell.holds(row))
        ]


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *sys.path])
    return env


def _lanes(cases: Iterable[Case]) -> list[list[Case]]:
    """Split the cases into balanced lanes, each run by one interpreter.

    The reference and the control on the default cell (full runs) go to different lanes and close them: besides
    their own verdict, they show that the runs before them in that interpreter left nothing behind that could make
    a check fail. The xla runs share the last lane (torch_xla starts once) and open it: torch_xla's device cannot
    join autograd after a CPU backward pass in the same interpreter.
    """
    lanes: list[list[Case]] = [[] for _ in range(LANES)]
    cases = list(cases)
    closing = sorted((c for c in cases if c.full and c.where == DEFAULT), key=lambda c: c.id)
    for i, case in enumerate(closing):
        lanes[i % LANES].append(case)
    for case in sorted((c for c in cases if c not in closing), key=lambda c: (not c.xla, -c.cost, c.id)):
        lane = lanes[-1] if case.xla else min(lanes, key=lambda lane: sum(c.cost for c in lane))
        lane.append(case)
    for lane in lanes:
        lane.sort(key=lambda c: (not c.xla) + (c in closing))
    return [lane for lane in lanes if lane]


def _run_lane(lane: list[Case], root: Path) -> dict[str, Run]:
    """Run one batch subprocess for ``lane`` and read what each of its cases left."""
    name = f"lane-{len(list(root.glob('lane-*.json')))}-{lane[0].id}".replace("/", "_")
    cases_file, cache = root / f"{name}.json", root / f"{name}.cache"
    specs = [{"id": c.id, "args": c.args(root / c.id, cache), "out": str(root / c.id)} for c in lane]
    cases_file.write_text(json.dumps(specs), encoding="utf-8")
    command = [sys.executable, "-m", "mutants._batch", str(cases_file)]
    try:
        batch = subprocess.run(command, cwd=REPO, env=_env(), capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
        batch_output = batch.stdout + batch.stderr
    except subprocess.TimeoutExpired as exc:
        batch_output = f"the batch ran past {BATCH_TIMEOUT_S} s: {exc}"
    runs = {}
    for case in lane:
        out = root / case.id
        exit_file, output_file, report = out / "exit", out / "output.txt", out / "report.json"
        output = output_file.read_text(encoding="utf-8") if output_file.is_file() else ""
        runs[case.id] = Run(
            case=case,
            exit=int(exit_file.read_text(encoding="utf-8")) if exit_file.is_file() else None,
            output=output if exit_file.is_file() else output + "\n--- the batch died here\n" + batch_output[-4000:],
            document=json.loads(report.read_text(encoding="utf-8")) if report.is_file() else None,
        )
    return runs


def _reads(item: pytest.Item) -> set[str]:
    """The case ids that one test of this file reads."""
    callspec = getattr(item, "callspec", None)
    params = callspec.params if callspec is not None else {}
    name = getattr(item, "originalname", item.name)
    if name == "test_mutant_is_caught":
        mutant = params["mutant"]
        return {mutant} if MUTANTS[mutant].cells.unavailable() is None else set()
    cell = params.get("cell")
    if isinstance(cell, Cells):
        impl = CONTROL if name == "test_control_passes_every_check" else REFERENCE
        return {_reference_id(impl, cell)} if cell.unavailable() is None else set()
    if name in ("test_every_check_has_a_mutant", "test_cell_less_checks_run_once"):
        return {_reference_id(REFERENCE, DEFAULT)}
    return set()


def _needed(items: Iterable[pytest.Item]) -> set[str]:
    """The case ids that the selected tests of this file read."""
    needed: set[str] = set()
    for item in items:
        if Path(str(item.path)) == Path(__file__):
            needed |= _reads(item)
    return needed


@pytest.fixture(scope="session")
def runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """Every run that the selected tests read, two lanes at a time, once per session."""
    root = tmp_path_factory.mktemp("mutant-runs")
    lanes = _lanes(CASES[case_id] for case_id in sorted(_needed(request.session.items)))
    results: dict[str, Run] = {}
    with ThreadPoolExecutor(max_workers=LANES) as pool:
        for lane_runs in pool.map(lambda lane: _run_lane(lane, root), lanes):
            results.update(lane_runs)
    return results


def _skip_if_unavailable(where: Cells) -> None:
    reason = where.unavailable()
    if reason is not None:
        pytest.skip(f"unavailable here: {reason}")


BROKEN_MUTANT = re.compile(r"has no attribute '_\w+'|\bNameError\b|cannot import name|No module named 'mutants")
"""A failure that shows the mutant crashing on the reference's internals (a private name a refactor removed, a
name or import that no longer exists), not the defect it stands for: not a catch."""


def _catches(run: Run, requirement: str, checks: Iterable[str]) -> tuple[list[dict[str, str]], list[str]]:
    """The rows that caught the mutant (failed, for a reason tied to its requirement), and every row that did not."""
    if run.document is None or run.exit != 1:
        return [], [run.explain()]
    caught, missed = [], []
    for check in checks:
        for cell in run.case.where.single():
            rows = run.rows(check, cell)
            if not rows:
                missed.append(f"{check} did not run on {cell.id} against {run.case.impl}:\n{run.explain()}")
            for row in rows:
                where = f"{row['check']} on {cell.id} against {run.case.impl}"
                if row["outcome"] != "failed":
                    missed.append(f"{where}: {row['outcome']} ({row['reason']}), not failed")
                elif BROKEN_MUTANT.search(row["reason"]):
                    missed.append(f"{where} failed because the mutant itself is broken: {row['reason']}")
                elif requirement not in row["requirements"] and requirement not in row["reason"]:
                    missed.append(
                        f"{where} failed, but neither its requirements {row['requirements']} nor its reason "
                        f"({row['reason']}) name {requirement}"
                    )
                else:
                    caught.append({"check": row["check"], "cell": cell.id})
    return caught, missed


def _assert_gap(run: Run, checks: Iterable[str]) -> None:
    """The checks still pass against a mutant whose ``known_gap`` says they miss it."""
    assert run.document is not None and run.exit == 0, run.explain()
    for check in checks:
        for cell in run.case.where.single():
            rows = run.rows(check, cell)
            assert rows, f"{check} did not run on {cell.id} against {run.case.impl}:\n{run.explain()}"
            caught = [
                f"{row['check']}: {row['outcome']} ({row['reason']})" for row in rows if row["outcome"] != "passed"
            ]
            assert not caught, (
                f"{run.case.impl} declares a known gap, but its checks now report it (drop its known_gap if each "
                "fails for a reason tied to its requirement):\n" + "\n".join(caught)
            )


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(runs: dict[str, Run], mutation_verdicts: dict[str, dict[str, Any]], mutant: str) -> None:
    """The checks named for the mutant fail (not error) on its cells, for a reason tied to its requirement.

    A mutant that declares a ``known_gap`` xfails while its checks still pass against it, and fails once they do
    not. Every verdict goes into the mutation report (``--mutation-report``, see ``tests/conftest.py``).
    """
    declared = MUTANTS[mutant]
    requirement, checks, where = declared.requirement, declared.checks, declared.cells
    verdict: dict[str, Any] = {
        "requirement": requirement,
        "blind": declared.blind,
        "cells": where.id,
        "checks": list(checks),
        "caught_by": [],
    }
    mutation_verdicts[mutant] = verdict
    reason = where.unavailable()
    if reason is not None:
        verdict.update(status="unavailable", detail=reason)
        pytest.skip(f"unavailable here: {reason}")
    caught, missed = _catches(runs[mutant], requirement, checks)
    verdict.update(caught_by=caught, status="survived" if missed else "killed", detail="\n".join(missed)[:2000])
    if mutant in KNOWN_GAPS:
        verdict["detail"] = f"known gap: {KNOWN_GAPS[mutant]}"
        _assert_gap(runs[mutant], checks)
        pytest.xfail(f"known gap of its checks: {KNOWN_GAPS[mutant]}")
    assert not missed, missed[0]


def _assert_passes_everything(run: Run, cell: Cells) -> None:
    """No check fails or errs; every check that a mutant on ``cell`` names ran there and passed."""
    assert run.document is not None and run.exit == 0, run.explain()
    bad = [
        f"{r['check']}: {r['outcome']} ({r['reason']})"
        for r in run.document["results"]
        if r["outcome"] not in ("passed", "n/a", "unavailable")
    ]
    assert not bad, f"--impl={run.case.impl} does not pass every check on {cell.id}:\n" + "\n".join(bad)
    there = [mutant for mutant in _runnable().values() if cell in mutant.cells.single()]
    missing = sorted(
        check
        for check in {check for mutant in there for check in mutant.checks}
        if not run.rows(check, cell) or any(row["outcome"] != "passed" for row in run.rows(check, cell))
    )
    assert not missing, (
        f"--impl={run.case.impl} did not run and pass, on {cell.id}, the checks that the mutants there name: "
        f"{missing}\n{run.explain()}"
    )


@pytest.mark.parametrize("cell", [DEFAULT], ids=[DEFAULT.id])
def test_reference_passes_every_check(runs: dict[str, Run], cell: Cells) -> None:
    """The reference passes every check on the default cell (``make conformance`` runs it on every cell)."""
    _skip_if_unavailable(cell)
    _assert_passes_everything(runs[_reference_id(REFERENCE, cell)], cell)


@pytest.mark.parametrize("cell", REFERENCE_CELLS, ids=[cell.id for cell in REFERENCE_CELLS])
def test_control_passes_every_check(runs: dict[str, Run], cell: Cells) -> None:
    """The mutants' base with nothing broken passes the checks: each failure is its mutant's defect.

    On the default cell it runs every check; on the others, those that the mutants there name.
    """
    _skip_if_unavailable(cell)
    _assert_passes_everything(runs[_reference_id(CONTROL, cell)], cell)


def _results(run: Run) -> list[dict[str, Any]]:
    assert run.document is not None, run.explain()
    results: list[dict[str, Any]] = run.document["results"]
    return results


def test_every_check_has_a_mutant(runs: dict[str, Run]) -> None:
    """The mutants' checks are exactly the checks the suite collects: a new check needs a mutant that it catches.

    The reference's run on the default cell collects every check (those of other cells as ``n/a`` rows). Every
    check and row it passes there must be named by a mutant that runs here and is not a known gap of its checks
    (a ``known_gap``, an xfail of ``test_mutant_is_caught``); a check that runs only on other cells must be named
    by some mutant (its rows there are not listed one by one).
    """
    results = _results(runs[_reference_id(REFERENCE, DEFAULT)])
    collected = {_base_name(row["check"]) for row in results}
    assert not collected - _named_checks(), (
        f"checks that no mutant is shown to fail: {sorted(collected - _named_checks())}"
    )
    assert not _named_checks() - collected, (
        f"the mutants name checks the suite lacks: {sorted(_named_checks() - collected)}"
    )
    rows = {row["check"] for row in results}
    exact = {check for mutant in MUTANTS.values() for check in mutant.checks if "[" in check}
    assert exact <= rows, f"the mutants name rows the suite lacks: {sorted(exact - rows)}"
    named = {check for name, mutant in _runnable().items() if name not in KNOWN_GAPS for check in mutant.checks}
    gaps = _named_checks(MUTANTS[name] for name in KNOWN_GAPS)
    uncaught = {
        row["check"]
        for row in results
        if row["outcome"] == "passed" and not {row["check"], _base_name(row["check"])} & (named | gaps)
    }
    assert not uncaught, f"checks that run here, but that no mutant running here is shown to fail: {sorted(uncaught)}"


def test_cell_less_checks_run_once(runs: dict[str, Run]) -> None:
    """``CELL_LESS`` is exactly the checks that take no cell (every run of a mutant on its cells keeps them out)."""
    cell_less = {row["check"] for row in _results(runs[_reference_id(REFERENCE, DEFAULT)]) if row["device"] is None}
    assert cell_less == set(CELL_LESS), f"the checks that take no cell are {sorted(cell_less)}, not {CELL_LESS}"


def test_every_mutant_declares_its_requirement() -> None:
    """Every mutant module declares its ``MUTANT``, with a known requirement of the family its folder is named after.

    A mutant lives in ``tests/mutants/<family>/``, the lower-case prefix of its requirement's id (``STEP-001``:
    ``step/``), a package whose docstring says what the family is; its docstring opens with ``<REQ> broken``; it
    names at least one check; ``blind`` is one of the blind batches. Nothing else sits in ``tests/mutants`` itself
    but its plumbing.
    """
    assert not UNREADABLE, "mutants whose MUTANT cannot be read:\n" + "\n".join(
        f"{name}: {why}" for name, why in sorted(UNREADABLE.items())
    )
    loose = sorted(path.name for path in MUTANT_DIR.glob("*.py") if path.stem not in PLUMBING)
    assert not loose, f"modules outside a family folder of tests/mutants: {loose}"
    families = {path.parent.name for path in MUTANT_DIR.glob("*/__init__.py")}
    for family in sorted(families):
        package = (MUTANT_DIR / family / "__init__.py").read_text(encoding="utf-8")
        assert ast.get_docstring(ast.parse(package)), f"mutants/{family}/__init__.py says nothing of its family"
    problems = []
    for path in _mutant_paths():
        name = _mutant_name(path)
        if name not in MUTANTS:
            continue
        mutant = MUTANTS[name]
        if mutant.requirement not in REQUIREMENTS:
            problems.append(f"{name}: unknown requirement {mutant.requirement}")
            continue
        family = requirement_group(mutant.requirement).lower()
        if name.rpartition(".")[0] != family or family not in families:
            problems.append(f"{name}: breaks {mutant.requirement}, so it belongs in tests/mutants/{family}/")
        if not mutant.checks:
            problems.append(f"{name}: names no check")
        if mutant.blind is not None and mutant.blind not in BLIND_BATCHES:
            problems.append(f"{name}: blind batch {mutant.blind!r} is none of {sorted(BLIND_BATCHES)}")
        docstring = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8")), clean=False)
        if docstring is None:
            problems.append(f"{name} has no module docstring")
        elif not re.match(rf"{re.escape(mutant.requirement)} broken\b", docstring):
            problems.append(f"{name}: the docstring must open with '{mutant.requirement} broken': {docstring[:80]!r}")
    assert not problems, "\n".join(problems)


def test_mutants_override_only_the_declared_seam() -> None:
    """A mutant's context overrides the four stages, the contract's members, construction and copies: nothing else.

    Everything else a mutant changes, it changes by replacing a collaborator in ``context.parts`` or through its
    wrapper (``new_wrapper``). The methods the wrappers call (``step_window``: the call around the stages, its
    transitions and its transaction; ``unscale_window``, ``zero_grad_window``, ...) are never replaced, so every
    mutant still leaves a failed call as its failure policy says, and a renamed stage fails here rather than silently.
    """
    from lightning_optimizer.reference import TrainingContext
    from lightning_optimizer.reference.stages import CONSTRUCTION_HOOKS, STAGE_NAMES
    from lightning_optimizer.spec import TrainingContext as ContextContract

    contract = {name for name in dir(ContextContract) if not name.startswith("_")}

    assert set(dir(TrainingContext)) >= STAGE_NAMES, (
        f"stages the context lacks: {STAGE_NAMES - set(dir(TrainingContext))}"
    )
    outside: dict[str, list[str]] = {}
    for path in sorted(MUTANT_DIR.rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if not isinstance(node, ast.ClassDef) or not any("Context" in ast.unparse(base) for base in node.bases):
                continue
            for item in node.body:
                name = getattr(item, "name", None)
                if not isinstance(item, ast.FunctionDef) or name is None:
                    continue
                declared = name in STAGE_NAMES or name in CONSTRUCTION_HOOKS or name in contract
                if not declared and hasattr(TrainingContext, name):
                    outside.setdefault(name, []).append(_mutant_name(path))
    assert not outside, f"mutants override context internals outside the declared stages: {outside}"
