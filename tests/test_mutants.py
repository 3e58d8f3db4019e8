"""Meta-tests of the conformance suite: each check catches a deliberately broken implementation.

Every module of ``tests/mutants`` (importable as ``mutants.<name>`` with ``PYTHONPATH=<repo>/tests``) is the
reference with one rule of the contract broken the way a real framework breaks it. The real suite runs against
each, on the cpu/32-true/ws1 cell and only for the checks that ``MUTANTS`` names, and every one of those must
report ``failed`` for a reason tied to the mutant's requirement. The reference, and the mutants' unbroken base
(``mutants._base``), must pass every check; every check the suite collects must catch at least one mutant.

The runs are ``pytest conformance ...`` sessions grouped into two batches (``mutants._batch``: one interpreter
per batch, so torch is imported twice, not once per mutant), run side by side and cached for the session.
"""

from __future__ import annotations

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

from lightning_optimizer.spec import REQUIREMENTS

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
MUTANT_DIR = TESTS / "mutants"
FILTERS = ("--devices=cpu", "--precisions=32-true", "--world-sizes=1")
REFERENCE = "lightning_optimizer.reference"
CONTROL = "mutants._base"
LANES = 2
BATCH_TIMEOUT_S = 900
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")

MUTANTS: dict[str, tuple[str, list[str]]] = {
    # module: (the requirement it breaks, the checks that must catch it). A check is a function name (every
    # row of it must fail) or ``name[params]`` (that row only).
    "true_follows_schedule": ("STEP-001", ["test_true_steps_now", "test_window_cut_short_applies_its_own_mean"]),
    "false_steps_anyway": ("STEP-002", ["test_false_accumulates_only", "test_gan_cadences"]),
    "outside_batch_always_steps": ("STEP-003", ["test_schedule_outside_a_batch_counts_micro_steps"]),
    "kwargs_dropped": ("STEP-005", ["test_kwargs_reach_the_inner_step"]),
    "step_returns_none": (
        "STEP-006",
        ["test_step_returns_the_closure_result", "test_lbfgs_evaluates_the_closure_itself"],
    ),
    "sum_not_mean": (
        "ACC-001",
        [
            "test_window_equals_concatenated_batch",
            "test_window_cut_short_applies_its_own_mean",
            "test_schedule_flushes_last_partial_window",
            "test_gan_cadences",
        ],
    ),
    "divides_by_accumulate_grad_batches": (
        "ACC-001",
        ["test_window_cut_short_applies_its_own_mean", "test_schedule_flushes_last_partial_window"],
    ),
    "loss_scaled_in_backward": ("ACC-002", ["test_plain_backward_gives_the_same_mean"]),
    "no_flush": ("ACC-003", ["test_schedule_flushes_last_partial_window"]),
    "no_zero_grad_after_step": ("ZERO-001", ["test_real_step_clears_gradients"]),
    "zero_grad_always_clears": ("ZERO-002", ["test_zero_grad_keeps_an_open_window"]),
    "closure_run_twice": ("CLOS-001", ["test_closure_runs_once_per_call"]),
    "lbfgs_closure_cached": ("CLOS-002", ["test_lbfgs_evaluates_the_closure_itself"]),
    "window_taken_before_closure": ("CLOS-003", ["test_closure_that_raises_changes_nothing"]),
    "failed_micro_step_counted": ("CLOS-003", ["test_closure_that_raises_changes_nothing"]),
    "backward_drops_arguments": ("BWD-001", ["test_backward_forwards_its_arguments"]),
    "autocast_always_on": ("PREC-001", ["test_true_precision_has_no_autocast"]),
    "no_toggling": (
        "TOGGLE-001",
        ["test_closure_sees_only_its_parameters", "test_toggle_model_block", "test_gan_cadences"],
    ),
    "toggle_not_restored_on_raise": ("TOGGLE-002", ["test_raising_closure_restores_flags", "test_toggle_model_block"]),
    "toggle_unfreezes": (
        "TOGGLE-002",
        ["test_closure_sees_only_its_parameters", "test_toggle_model_block", "test_raising_closure_restores_flags"],
    ),
    "composition_wrapper": ("PROXY-001", ["test_isinstance_of_the_inner_class"]),
    "copied_param_groups": ("PROXY-002", ["test_proxied_objects_are_the_inner_ones"]),
    "writes_stay_on_wrapper": ("PROXY-003", ["test_writes_reach_the_inner_optimizer"]),
    "hooks_on_wrapper": ("PROXY-004", ["test_step_hooks_fire_on_real_steps"]),
    "bare_repr": ("PROXY-005", ["test_repr_names_the_inner_optimizer"]),
    "scheduler_patch_forwarded": ("SCHED-001", ["test_scheduler_follows_real_steps_without_warnings[wrapper]"]),
    "class_step_bypasses_patch": ("SCHED-001", ["test_scheduler_follows_real_steps_without_warnings[inner]"]),
    "nested_state_dict": ("CKPT-001", ["test_state_dict_is_the_inner_format"]),
    "context_drops_window_grads": (
        "CKPT-002",
        ["test_resume_at_every_micro_step_is_bit_identical", "test_resume_in_a_fresh_process"],
    ),
    "process_local_checkpoint": ("CKPT-002", ["test_resume_in_a_fresh_process"]),
    "context_load_unvalidated": ("CKPT-003", ["test_context_state_for_another_layout_is_refused"]),
    "context_load_checks_count_only": ("CKPT-003", ["test_context_state_for_another_layout_is_refused"]),
    "pickle_loses_window": ("PICKLE-001", ["test_copies_continue_independently"]),
    "non_callable_closure_ignored": ("ERR-001", ["test_non_callable_closure"]),
    "closure_type_unchecked": ("ERR-001", ["test_non_callable_closure"]),
    "truthy_make_optimizer_step": ("ERR-002", ["test_non_bool_make_optimizer_step"]),
    "unvalidated_accumulate_grad_batches": ("CTX-001", ["test_invalid_accumulate_grad_batches"]),
    "unknown_names_fall_back": ("ERR-003", ["test_unknown_precision_or_device"]),
    "wrapper_unwrapped": ("ERR-004", ["test_wrapping_a_wrapper"]),
    "lenient_optimizer_load": ("ERR-005", ["test_state_dict_of_another_layout"]),
    "zero_grad_old_default": ("SURFACE-001", ["test_wrapper_surface"]),
    "renamed_accumulation_property": ("SURFACE-002", ["test_context_surface"]),
    "static_lightning_step": ("SURFACE-001", ["test_static_surface"]),
    "static_untyped_info": ("SURFACE-002", ["test_static_surface"]),
}

# Rough seconds per run, to split the runs evenly between the lanes.
_FULL_RUN_S, _STATIC_S, _FRESH_PROCESS_S, _RUN_S = 40.0, 22.0, 8.0, 2.0


def _base_name(check: str) -> str:
    return check.partition("[")[0]


def _table_checks() -> set[str]:
    return {_base_name(check) for _, checks in MUTANTS.values() for check in checks}


@dataclass(frozen=True)
class Case:
    """One run of the suite: an implementation and the checks it runs (all of them when ``checks`` is empty)."""

    id: str
    impl: str
    checks: tuple[str, ...] = ()

    def args(self, out: Path) -> list[str]:
        """The suite's arguments, writing its report and temporary files under ``out``."""
        selection = ["-k", " or ".join(sorted({_base_name(c) for c in self.checks}))] if self.checks else []
        files = [f"--report-json={out / 'report.json'}", f"--basetemp={out / 'tmp'}"]
        return [f"--impl={self.impl}", *FILTERS, *selection, *files, "-q"]

    @property
    def cost(self) -> float:
        if not self.checks:
            return _FULL_RUN_S
        names = {_base_name(c) for c in self.checks}
        return (
            _RUN_S
            + _STATIC_S * ("test_static_surface" in names)
            + _FRESH_PROCESS_S * ("test_resume_in_a_fresh_process" in names)
        )


@dataclass(frozen=True, repr=False)
class Run:
    """What one case left: its exit status (``None`` if its batch died first), output and report."""

    case: Case
    exit: int | None
    output: str
    document: dict[str, Any] | None

    def __repr__(self) -> str:
        return f"Run({self.case.impl}, exit={self.exit})"

    def explain(self) -> str:
        return f"--impl={self.case.impl}: exit {self.exit}\n--- output (tail)\n{self.output[-6000:]}"

    def rows(self, check: str) -> list[dict[str, Any]]:
        """The report's rows of ``check`` (a function name: all its rows; ``name[params]``: that row)."""
        assert self.document is not None, self.explain()
        exact = "[" in check
        return [
            row for row in self.document["results"] if (row["check"] if exact else _base_name(row["check"])) == check
        ]


def _cases() -> dict[str, Case]:
    cases = {REFERENCE: Case(REFERENCE, REFERENCE), CONTROL: Case(CONTROL, CONTROL)}
    for name, (_, checks) in MUTANTS.items():
        cases[name] = Case(name, f"mutants.{name}", tuple(checks))
    return cases


CASES = _cases()

_READS = {
    "test_reference_passes_every_check": (REFERENCE,),
    "test_every_check_has_a_mutant": (REFERENCE,),
    "test_control_passes_every_check": (CONTROL,),
}
"""The runs that each test without a ``mutant`` parameter reads."""


def _env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), *sys.path])
    return env


def _lanes(cases: Iterable[Case]) -> list[list[Case]]:
    """Split the cases into balanced lanes, each run by one interpreter.

    The reference and the control (full runs, which land in different lanes) close their lanes: besides their
    own verdict, they show that the mutants run before them in that interpreter left nothing behind that could
    make a check fail.
    """
    lanes: list[list[Case]] = [[] for _ in range(LANES)]
    for case in sorted(cases, key=lambda c: (-c.cost, c.id)):
        min(lanes, key=lambda lane: sum(c.cost for c in lane)).append(case)
    for lane in lanes:
        lane.sort(key=lambda c: c.id in (REFERENCE, CONTROL))
    return [lane for lane in lanes if lane]


def _run_lane(lane: list[Case], root: Path) -> dict[str, Run]:
    """Run one batch subprocess for ``lane`` and read what each of its cases left."""
    cases_file = root / f"lane-{lane[0].id}.json"
    specs = [{"id": c.id, "args": c.args(root / c.id), "out": str(root / c.id)} for c in lane]
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


def _needed(items: Iterable[pytest.Item]) -> set[str]:
    """The case ids that the selected tests of this file read."""
    needed: set[str] = set()
    for item in items:
        if Path(str(item.path)) != Path(__file__):
            continue
        callspec = getattr(item, "callspec", None)
        mutant = callspec.params.get("mutant") if callspec is not None else None
        if isinstance(mutant, str):
            needed.add(mutant)
        needed.update(_READS.get(getattr(item, "originalname", item.name), ()))
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


def _assert_caught(run: Run, requirement: str, checks: list[str]) -> None:
    assert run.document is not None and run.exit == 1, run.explain()
    for check in checks:
        rows = run.rows(check)
        assert rows, f"{check} did not run against {run.case.impl}:\n{run.explain()}"
        for row in rows:
            where = f"{row['check']} against {run.case.impl}"
            assert row["outcome"] == "failed", f"{where}: {row['outcome']} ({row['reason']}), not failed"
            assert requirement in row["requirements"] or requirement in row["reason"], (
                f"{where} failed, but neither its requirements {row['requirements']} nor its reason "
                f"({row['reason']}) name {requirement}"
            )


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_mutant_is_caught(runs: dict[str, Run], mutant: str) -> None:
    """The checks named for the mutant fail (not error) against it, for a reason tied to its requirement."""
    requirement, checks = MUTANTS[mutant]
    _assert_caught(runs[mutant], requirement, checks)


def _assert_passes_everything(run: Run) -> None:
    assert run.document is not None and run.exit == 0, run.explain()
    bad = [f"{r['check']}: {r['outcome']} ({r['reason']})" for r in run.document["results"] if r["outcome"] != "passed"]
    assert not bad, f"--impl={run.case.impl} does not pass every check:\n" + "\n".join(bad)
    missing = sorted(check for check in _table_checks() if not run.rows(check))
    assert not missing, f"--impl={run.case.impl} did not run {missing}"


def test_reference_passes_every_check(runs: dict[str, Run]) -> None:
    """The reference passes every check (those of the table included) on the mutants' cell."""
    _assert_passes_everything(runs[REFERENCE])


def test_control_passes_every_check(runs: dict[str, Run]) -> None:
    """The mutants' base with nothing broken passes every check: each failure is its mutant's defect."""
    _assert_passes_everything(runs[CONTROL])


def test_every_check_has_a_mutant(runs: dict[str, Run]) -> None:
    """The table's checks are exactly the checks the suite runs: a new check needs a mutant that it catches."""
    document = runs[REFERENCE].document
    assert document is not None, runs[REFERENCE].explain()
    collected = {_base_name(row["check"]) for row in document["results"]}
    assert not collected - _table_checks(), (
        f"checks that no mutant is shown to fail: {sorted(collected - _table_checks())}"
    )
    assert not _table_checks() - collected, (
        f"the table names checks the suite lacks: {sorted(_table_checks() - collected)}"
    )
    rows = {row["check"] for row in document["results"]}
    exact = {check for _, checks in MUTANTS.values() for check in checks if "[" in check}
    assert exact <= rows, f"the table names rows the suite lacks: {sorted(exact - rows)}"


def test_tables_match_the_mutant_modules() -> None:
    """Every mutant module is in one table, under a known requirement id that its docstring names."""
    modules = {path.stem for path in MUTANT_DIR.glob("*.py") if not path.stem.startswith("_")}
    tabled = {name: entry[0] for name, entry in MUTANTS.items()}
    assert modules == set(tabled), f"modules without an entry: {modules - set(tabled)}; entries without a module: " + (
        f"{set(tabled) - modules}"
    )
    for name, requirement in tabled.items():
        assert requirement in REQUIREMENTS, f"{name}: unknown requirement {requirement}"
        source = (MUTANT_DIR / f"{name}.py").read_text(encoding="utf-8")
        docstring = re.match(r'\s*"""(.*?)"""', source, re.DOTALL)
        assert docstring is not None, f"{name} has no module docstring"
        assert re.match(rf"{re.escape(requirement)} broken\b", docstring.group(1)), (
            f"{name}: the docstring must open with '{requirement} broken': {docstring.group(1)[:80]!r}"
        )
