"""Self-tests of the conformance suite's pytest plugin: the real suite, run in subprocesses.

The fake implementations live in ``tests/plugin_impls`` (importable as ``plugin_impls.<name>``). Runs select
the cheap surface checks; the static mypy check runs once, in the reference's run over the whole matrix.

To keep the file fast on few cores, two subprocesses start in the background with the module's first test:
the reference's run, and ``plugin_impls.run_many``, which runs every case of ``BATCH`` as a fresh
``pytest.main`` session in one interpreter (torch imported once). The tests that need a subprocess of their
own (the exact stderr of a usage error, the installed console script) run in the foreground meanwhile.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

from lightning_optimizer.conformance import isolation
from lightning_optimizer.conformance.report import OUTCOMES
from lightning_optimizer.reference import conformance_info as reference_info
from lightning_optimizer.spec import CONTRACT_VERSION, DEVICE_KINDS, PRECISIONS

REPO = Path(__file__).resolve().parents[1]
IMPLS = REPO / "tests"
_HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None
XFAILS = "tests/plugin_impls/expected_failures"
"""The expected-failures files of the runs, relative to the repository root (where the runs start)."""
MISSING_DEVICE = next(
    (device for device, there in (("cuda", torch.cuda.is_available()), ("xla", _HAS_TORCH_XLA)) if not there), None
)
"""A device this machine lacks, for a run that requires it (``None`` where it has them all)."""
USAGE_ERROR = 4
RESULT_KEYS = {
    *("check", "requirements", "device", "precision", "world_size"),
    *("outcome", "reason", "observed", "duration_s"),
}
_LEAKY_ENV = ("LIGHTNING_OPTIMIZER_IMPL", "PYTEST_ADDOPTS", "PYTEST_PLUGINS", "PYTEST_CURRENT_TEST")
# A hang guard on every suite run here, never a speed check: the longest, the batch of cases run in the background, took
# 92 s on 2 cores beside the other runs and other jobs (load 3.5); the others up to 21 s. 1800 s is 20 times that.
TIMEOUT_S = 1800

Run = subprocess.CompletedProcess[str]


def _env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if key not in _LEAKY_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(IMPLS), env.get("PYTHONPATH")]))
    return env | extra


def _explain(run: Run) -> str:
    return f"exit {run.returncode}\n--- stdout\n{run.stdout[-6000:]}\n--- stderr\n{run.stderr[-3000:]}"


def _run(command: list[str], cwd: Path, env: dict[str, str]) -> Run:
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)


class Background:
    """A subprocess started now, whose output goes to files in ``folder``; ``wait()`` gives its result."""

    def __init__(self, command: list[str], folder: Path, env: dict[str, str]) -> None:
        self.folder = folder
        with (folder / "stdout").open("w") as out, (folder / "stderr").open("w") as err:
            self.process = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=err, text=True)

    def wait(self) -> Run:
        code = self.process.wait(timeout=TIMEOUT_S)
        out, err = ((self.folder / name).read_text(encoding="utf-8") for name in ("stdout", "stderr"))
        return Run(self.process.args, code, out, err)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass
class Reported:
    """One run of the suite with its JSON and Markdown reports."""

    run: Run
    document: dict[str, Any]
    markdown: str


def _reported(run: Run, json_path: Path, md_path: Path) -> Reported:
    assert json_path.is_file(), _explain(run)
    assert md_path.is_file(), _explain(run)
    document = json.loads(json_path.read_text(encoding="utf-8"))
    return Reported(run, document, md_path.read_text(encoding="utf-8"))


def result(document: dict[str, Any], check: str, cell: str | None) -> dict[str, Any]:
    """The one result row of ``check`` in ``cell`` (``device/precision/wsN[-fsdp]``; ``None``: cell-less checks)."""
    rows: list[dict[str, Any]] = [
        row for row in document["results"] if row["check"] == check and _cell_column(row) == cell
    ]
    assert len(rows) == 1, f"{len(rows)} results for {check} in {cell}: {document['results']}"
    return rows[0]


def _cell_column(row: dict[str, Any]) -> str | None:
    if row["device"] is None:
        return None
    sharded = "-fsdp" if row["strategy"] == "fsdp" else ""
    return f"{row['device']}/{row['precision']}/ws{row['world_size']}{sharded}"


def _assert_usage_error(run: Run, needles: Iterable[str]) -> str:
    """Exit code 4 and exactly one non-blank stderr line, ``ERROR: ...`` with every needle in it."""
    assert run.returncode == USAGE_ERROR, _explain(run)
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, _explain(run)
    assert lines[0].startswith("ERROR: "), _explain(run)
    for needle in needles:
        assert needle in lines[0], f"{needle!r} not in {lines[0]!r}"
    assert "conformance matrix" not in run.stdout
    return lines[0]


# -- the runs ------------------------------------------------------------------------------------------

USAGE_CASES: dict[str, tuple[str, list[str]]] = {
    "no-info": ("--impl=plugin_impls.no_info", ["plugin_impls.no_info", "conformance_info"]),
    "no-such-attr": ("--impl=plugin_impls.only_fp64:nothing_here", ["nothing_here"]),
    "not-info": ("--impl=plugin_impls.not_info", ["dict", "not a", "ImplementationInfo"]),
    "bad-precision-claim": ("--impl=plugin_impls.unknown_precision", ["unknown precisions", "fp8-true"]),
    "bad-contract": ("--impl=plugin_impls.unknown_contract", ["1999.01", CONTRACT_VERSION]),
    "missing-dependency": (
        "--impl=plugin_impls.missing_dependency",
        ["plugin_impls.missing_dependency", "plugin_impls_absent_dependency"],
    ),
    "prefix-dependency": ("--impl=plugin_impls.prefix_dependency", ["'plugin_imp'"]),
    "empty-impl": ("--impl=", ["--impl is empty"]),
    "bad-precision-filter": ("--precisions=fp17", ["fp17", "--precisions", *PRECISIONS]),
    "bad-precision-in-list": ("--precisions=32-true,fp17", ["fp17", "--precisions"]),
    "bad-device-filter": ("--devices=tpu", ["tpu", "--devices", *DEVICE_KINDS]),
    "bad-world-size-filter": ("--world-sizes=3", ["'3'", "--world-sizes", "1, 2"]),
    "empty-device-filter": ("--devices=", ["--devices is empty", *DEVICE_KINDS]),
    "missing-expected-failures-file": (f"--expected-failures-file={XFAILS}/absent.txt", ["absent.txt", "no such file"]),
    "expected-failure-without-reason": (
        f"--expected-failures-file={XFAILS}/no_reason.txt",
        ["no_reason.txt", "line 3", "'test_wrapper_surface' gives no reason"],
    ),
    "expected-failure-space-before-bracket": (
        f"--expected-failures-file={XFAILS}/space_before_bracket.txt",
        ["space_before_bracket.txt", "line 1", "a space between", "test_wrapper_surface[cpu-*]"],
    ),
    "expected-failure-unclosed-bracket": (
        f"--expected-failures-file={XFAILS}/unclosed_bracket.txt",
        ["unclosed_bracket.txt", "line 2", "'test_wrapper_surface[cpu-*'", "one pair of brackets"],
    ),
    "expected-failure-twice": (
        f"--expected-failures-file={XFAILS}/duplicate.txt",
        ["duplicate.txt", "line 3", "already declared on line 1"],
    ),
    "expected-failure-not-a-name": (
        f"--expected-failures-file={XFAILS}/bad_name.txt",
        ["bad_name.txt", "line 1", "'wrapper-surface' is not a check name"],
    ),
    "malformed-declaration": (
        "--impl=plugin_impls.malformed_declaration",
        ["plugin_impls.malformed_declaration", "expected_failures", "'test_wrapper_surface[cpu-32-true'"],
    ),
    "bad-required-device": ("--require-devices=tpu", ["tpu", "--require-devices", *DEVICE_KINDS]),
    "required-device-not-claimed": (
        "--impl=plugin_impls.only_fp64 --require-devices=xla",
        ["--require-devices", "xla", "'fp64 only' does not claim", "claims cpu"],
    ),
    "required-device-filtered-out": (
        "--devices=cpu --require-devices=xla",
        ["--require-devices names xla", "--devices=cpu leaves out"],
    ),
    "property-examples-zero": ("--property-examples=0", ["--property-examples=0", "at least 1"]),
    "property-examples-not-a-number": ("--property-examples=many", ["--property-examples=many", "not an integer"]),
}
"""Case id: the bad options (separated by spaces), and what the one-line error must name."""

LEAKING_PRECISION = "64-true"
"""Where ``plugin_impls.leaky_state`` leaks: the first precision of the matrix order, so 32-true runs after."""
LEAKS: dict[str, tuple[str, str]] = {
    # kind of plugin_impls.leaky_state with a run of its own: what the suite must name, the values it must give
    "dtype": ("default dtype", "torch.float32 before the check, torch.float64 after"),
    "grad_mode": ("grad mode", "True before the check, False after"),
    "autocast": ("autocast (cpu)", "False before the check, True after"),
    "env": ("environment variable LIGHTNING_OPTIMIZER_LEAKED_BY_TEST", "unset before the check, '1' after"),
    "deterministic": ("deterministic algorithms", "off before the check, on, warn only after"),
}
ALSO_LEAKED = {
    # what plugin_impls.leaky_state:everything leaks besides LEAKS
    "inference mode": "False before the check, True after",
    "open autocast regions": "0 before the check, 1 after",
    "anomaly detection": "off before the check, on, checking NaN after",
    "intra-op threads": "",
    "default device": "cpu before the check, meta after",
    "cuDNN benchmark": "False before the check, True after",
    "default process group initialized": "False before the check, True after",
}

_CPU_WRAPPER = ["-k", "wrapper_surface", "--devices=cpu"]
REPORTED_CASES: dict[str, dict[str, Any]] = {
    "declared-but-passes": {"args": ["--impl=plugin_impls.declared_deviation", *_CPU_WRAPPER]},
    "declared-and-fails": {"args": ["--impl=plugin_impls.broken_wrapper:declared_info", *_CPU_WRAPPER]},
    "undeclared-and-fails": {"args": ["--impl=plugin_impls.broken_wrapper", *_CPU_WRAPPER]},
    "only-fp64-from-env": {
        "args": [*_CPU_WRAPPER, "--world-sizes=1"],
        "env": {"LIGHTNING_OPTIMIZER_IMPL": "plugin_impls.only_fp64"},
    },
    "filters": {
        "args": [
            "--impl=plugin_impls.reference_alias:info",
            "-k",
            "surface",
            "--devices=cpu",
            "--precisions=32-true",
            "--world-sizes=1",
        ]
    },
    "file-declares-deviation": {
        "args": [
            "--impl=plugin_impls.broken_wrapper",
            "-k",
            "wrapper_surface or context_surface",
            "--devices=cpu",
            "--precisions=32-true",
            "--world-sizes=1",
            f"--expected-failures-file={XFAILS}/broken_wrapper.txt",
            "--require-devices=cpu",
            "--property-examples=+7",
        ]
    },
    "file-declares-deviation-strictly": {
        "args": [
            "--impl=plugin_impls.broken_wrapper",
            *_CPU_WRAPPER,
            "--precisions=32-true",
            f"--expected-failures-file={XFAILS}/broken_wrapper.txt",
            "--strict-expected-failures",
        ]
    },
    "file-declares-a-passing-check": {
        "args": [
            "--impl=plugin_impls.reference_alias:info",
            *_CPU_WRAPPER,
            "--precisions=32-true",
            "--world-sizes=1",
            f"--expected-failures-file={XFAILS}/reference_passes.txt",
        ]
    },
    "leading-minus": {
        "args": [
            "--impl=lightning_optimizer.reference",
            "-k",
            "invalid_accumulate_grad_batches",
            "--devices=cpu",
            "--precisions=32-true",
            "--world-sizes=1",
            f"--expected-failures-file={XFAILS}/minus_one.txt",
        ]
    },
    "skips-itself": {
        "args": ["--impl=plugin_impls.skips_itself", *_CPU_WRAPPER, "--precisions=32-true", "--world-sizes=1"]
    },
    "required-device-nothing-ran": {
        "args": ["--impl=plugin_impls.only_fp64", *_CPU_WRAPPER, "--precisions=32-true", "--require-devices=cpu"]
    },
    **(
        {
            "required-device-unavailable": {
                "args": [
                    "--impl=lightning_optimizer.reference",
                    "-k",
                    "wrapper_surface",
                    f"--devices=cpu,{MISSING_DEVICE}",
                    "--precisions=32-true",
                    "--world-sizes=1",
                    f"--require-devices={MISSING_DEVICE}",
                ]
            }
        }
        if MISSING_DEVICE is not None
        else {}
    ),
    **{
        f"leak-{kind}": {
            "args": [
                f"--impl=plugin_impls.leaky_state:{kind}",
                *_CPU_WRAPPER,
                f"--precisions={LEAKING_PRECISION},32-true",
                "--world-sizes=1",
            ]
        }
        for kind in (*LEAKS, "everything")
    },
}
"""Case id: a run that gets to the matrix, and writes ``<case>.json`` and ``<case>.md``."""

OTHER_CASES: dict[str, list[str]] = {
    "help": ["--help"],
    "full-matrix": ["--impl=lightning_optimizer.reference", *_CPU_WRAPPER, "--world-sizes=1", "--matrix=full"],
}
"""Case id: a run whose output is all that is checked."""


@pytest.fixture(scope="module", autouse=True)
def _background(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Background]]:
    """Start the reference's run and the batch of cases with the module's first test."""
    reference = tmp_path_factory.mktemp("reference")
    command = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider"]
    command += ["--impl=lightning_optimizer.reference", "-k", "surface"]
    command += [f"--report-json={reference / 'report.json'}", f"--report-md={reference / 'report.md'}"]
    command += [f"--report-html={reference / 'report.html'}"]  # the last argument (test_reference_html_report)
    started = {"reference": Background(command, reference, _env())}

    batch = tmp_path_factory.mktemp("batch")
    cases: dict[str, dict[str, Any]] = {
        case: {"args": [*options.split(), "-k", "wrapper_surface"]} for case, (options, _) in USAGE_CASES.items()
    }
    cases |= {case: {"args": args} for case, args in OTHER_CASES.items()}
    for case, spec in REPORTED_CASES.items():
        reports = [f"--report-json={batch / f'{case}.json'}", f"--report-md={batch / f'{case}.md'}"]
        cases[case] = {"args": [*spec["args"], *reports], "env": spec.get("env", {})}
    (batch / "cases.json").write_text(json.dumps(cases), encoding="utf-8")
    command = [sys.executable, "-m", "plugin_impls.run_many", str(batch / "cases.json"), str(batch / "results.json")]
    started["batch"] = Background(command, batch, _env())
    yield started
    for process in started.values():
        process.stop()


@pytest.fixture(scope="module")
def batch(_background: dict[str, Background]) -> dict[str, Run]:
    """The result of every case of ``USAGE_CASES`` and ``REPORTED_CASES``."""
    driver = _background["batch"]
    run = driver.wait()
    results = driver.folder / "results.json"
    assert results.is_file(), _explain(run)
    return {
        case: Run(["pytest", "conformance", case], got["exit"], got["stdout"], got["stderr"])
        for case, got in json.loads(results.read_text(encoding="utf-8")).items()
    }


@pytest.fixture(scope="module")
def reported(batch: dict[str, Run], _background: dict[str, Background]) -> dict[str, Reported]:
    """The cases of ``REPORTED_CASES`` with their reports."""
    folder = _background["batch"].folder
    return {case: _reported(batch[case], folder / f"{case}.json", folder / f"{case}.md") for case in REPORTED_CASES}


@pytest.fixture(scope="module")
def reference(_background: dict[str, Background]) -> Reported:
    """The reference on the whole matrix, surface checks (the static mypy check included), both reports."""
    process = _background["reference"]
    return _reported(process.wait(), process.folder / "report.json", process.folder / "report.md")


# -- usage errors --------------------------------------------------------------------------------------


def test_impl_module_that_does_not_exist_is_a_one_line_usage_error() -> None:
    """A subprocess of its own: nothing else may reach the real stderr, not even by file descriptor."""
    command = [sys.executable, "-m", "pytest", "conformance", "-p", "no:cacheprovider"]
    run = _run([*command, "--impl=plugin_impls.no_such_module", "-k", "wrapper_surface"], REPO, _env())
    line = _assert_usage_error(run, ["plugin_impls.no_such_module"])
    assert "no module named" in line
    assert "Traceback" not in run.stderr + run.stdout


@pytest.mark.parametrize("case", list(USAGE_CASES))
def test_bad_input_is_a_one_line_usage_error(batch: dict[str, Run], case: str) -> None:
    _assert_usage_error(batch[case], USAGE_CASES[case][1])


# -- the installed package -----------------------------------------------------------------------------


def test_console_script_is_declared() -> None:
    scripts = importlib.metadata.entry_points(group="console_scripts", name="lightning-optimizer-conformance")
    assert [script.value for script in scripts] == ["lightning_optimizer.conformance.cli:main"]


def _run_cli(cwd: Path, *args: str) -> Run:
    """``python -m lightning_optimizer.conformance.cli ARGS`` in ``cwd``, with nothing of the checkout on the path."""
    command = [sys.executable, "-m", "lightning_optimizer.conformance.cli", "-p", "no:cacheprovider", *args]
    env = {key: value for key, value in os.environ.items() if key not in (*_LEAKY_ENV, "PYTHONPATH")}
    return _run(command, cwd, env)


def test_cli_runs_the_installed_suite_outside_the_repository(tmp_path: Path) -> None:
    run = _run_cli(tmp_path, "--impl=lightning_optimizer.reference", "-k", "wrapper_surface", "--devices=cpu")
    assert run.returncode == 0, _explain(run)
    assert f"rootdir: {tmp_path}" in run.stdout
    assert "conformance matrix" in run.stdout, _explain(run)
    matrix = run.stdout[run.stdout.index("conformance matrix") :].splitlines()
    assert [line.split() for line in matrix if line.startswith("cpu/32-true/ws1 ")] == [
        ["cpu/32-true/ws1", "1", "0", "0", "0", "0", "0"]
    ]
    assert any(line.split()[:2] == ["SURFACE", "ok"] for line in matrix), matrix
    assert not list(tmp_path.iterdir()), "the run left files in the working directory"


def test_cli_knows_the_suite_markers(tmp_path: Path) -> None:
    run = _run_cli(tmp_path, "--impl=lightning_optimizer.reference", "--collect-only", "-q", "--strict-markers")
    assert run.returncode == 0, _explain(run)
    assert "PytestUnknownMarkWarning" not in run.stdout + run.stderr


# -- declared deviations -------------------------------------------------------------------------------


def test_declared_deviation_that_passes_fails(reported: dict[str, Reported]) -> None:
    got = reported["declared-but-passes"]
    assert got.run.returncode == 1, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")
    assert row["outcome"] == "failed", row
    assert "unexpected pass" in row["reason"]
    assert got.document["summary"]["failed"] == 1
    assert got.document["summary"]["passed"] == got.document["summary"]["deviation"] == 0
    assert "XPASS(strict)" in got.run.stdout


def test_real_deviation_when_declared(reported: dict[str, Reported]) -> None:
    got = reported["declared-and-fails"]
    assert got.run.returncode == 0, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")
    assert row["outcome"] == "deviation", row
    assert row["reason"] == "the wrapper has no backward; call loss.backward() instead"
    assert got.document["impl"]["module"] == "plugin_impls.broken_wrapper"
    assert got.document["impl"]["name"] == "no backward, declared"
    assert got.document["summary"]["deviation"] == 1
    assert got.document["summary"]["failed"] == got.document["summary"]["error"] == 0
    assert "## Failures, errors and deviations" in got.markdown
    assert "**deviation**: the wrapper has no backward" in got.markdown


def test_missing_member_fails_when_undeclared(reported: dict[str, Reported]) -> None:
    got = reported["undeclared-and-fails"]
    assert got.run.returncode == 1, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")
    assert row["outcome"] == "failed", row
    assert "backward: missing" in row["reason"]
    assert got.document["summary"]["failed"] == 1
    assert got.document["summary"]["deviation"] == 0
    assert "**failed**" in got.markdown


# -- expected-failures files ---------------------------------------------------------------------------


def test_file_declares_a_deviation_and_lists_stale_entries(reported: dict[str, Reported]) -> None:
    got = reported["file-declares-deviation"]
    assert got.run.returncode == 0, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")
    assert (row["outcome"], row["reason"]) == (
        "deviation",
        "the wrapper has no backward; call loss.backward() (file entry, issue #7)",
    )
    assert result(got.document, "test_context_surface", "cpu/32-true/ws1")["outcome"] == "passed"
    entries = {entry["entry"]: entry for entry in got.document["expected_failures"]}
    assert list(entries) == ["test_wrapper_surface[cpu-*]", "test_context_surface[cuda-*]", "test_wrapper_surfaec"]
    used = entries["test_wrapper_surface[cpu-*]"]
    assert (used["stale"], used["why_stale"], used["source"]) == (False, "", f"{XFAILS}/broken_wrapper.txt:4")
    cuda = entries["test_context_surface[cuda-*]"]
    assert cuda["stale"], cuda
    assert "no collected row or cell of test_context_surface matches it" in cuda["why_stale"]
    misspelt = entries["test_wrapper_surfaec"]
    assert misspelt["stale"], misspelt
    assert "no check named test_wrapper_surfaec was collected" in misspelt["why_stale"]
    assert got.document["run_failures"] == []
    assert got.document["required_devices"] == ["cpu"]
    assert "conformance: required devices: cpu" in got.run.stdout
    assert "conformance: property-based checks run 7 examples each" in got.run.stdout
    matrix = got.run.stdout[got.run.stdout.index("conformance matrix") :]
    assert "stale expected-failure entries (2; they name no check that ran):" in matrix
    assert f"test_wrapper_surfaec ({XFAILS}/broken_wrapper.txt:6): no check named" in matrix
    assert "run failed" not in matrix
    assert "## Stale expected-failure entries" in got.markdown
    assert "- `test_context_surface[cuda-*]`" in got.markdown


def test_stale_entries_fail_a_strict_run(reported: dict[str, Reported]) -> None:
    got = reported["file-declares-deviation-strictly"]
    assert got.run.returncode == 1, _explain(got.run)
    assert result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")["outcome"] == "deviation"
    assert got.document["summary"]["failed"] == got.document["summary"]["error"] == 0
    failure = "2 stale expected-failure entries (--strict-expected-failures)"
    assert got.document["run_failures"] == [failure]
    assert f"run failed: {failure}" in got.run.stdout
    assert "## The run failed" in got.markdown


def test_file_entry_for_a_check_that_passes_fails_naming_the_entry(reported: dict[str, Reported]) -> None:
    got = reported["file-declares-a-passing-check"]
    assert got.run.returncode == 1, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")
    assert row["outcome"] == "failed", row
    assert row["reason"] == (
        f"unexpected pass: the check passes, but 'test_wrapper_surface' ({XFAILS}/reference_passes.txt:2) declares "
        "it a deviation (thought the wrapper lacked a member); remove that entry"
    )
    assert "XPASS(strict)" in got.run.stdout
    assert "reference_passes.txt:2" in got.run.stdout
    assert [entry["stale"] for entry in got.document["expected_failures"]] == [False]


def test_parameter_ids_keep_their_minus_sign(reported: dict[str, Reported]) -> None:
    """``[-1]`` stays ``[-1]`` in the rows and in expected-failure matching: only that row is declared."""
    got = reported["leading-minus"]
    assert got.run.returncode == 1, _explain(got.run)
    rows = {row["check"]: row for row in got.document["results"]}
    names = {"-1", "0", "2.0", "True", "str"}
    assert set(rows) == {f"test_invalid_accumulate_grad_batches[{name}]" for name in names}, sorted(rows)
    minus = rows["test_invalid_accumulate_grad_batches[-1]"]
    assert minus["outcome"] == "failed" and minus["reason"].startswith("unexpected pass"), minus
    others = [row["outcome"] for name, row in rows.items() if not name.endswith("[-1]")]
    assert others == ["passed"] * 4, rows
    assert "test_invalid_accumulate_grad_batches[-1]" in got.markdown


def test_a_skip_that_says_nothing_typed_is_an_error(reported: dict[str, Reported]) -> None:
    """Skips are classified by their exception type: a plain ``pytest.skip`` is neither n/a nor unavailable."""
    got = reported["skips-itself"]
    assert got.run.returncode == 1, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")
    assert row["outcome"] == "error", row
    assert "this implementation would rather not" in row["reason"]
    assert "outcomes.NotApplicable" in row["reason"]


def test_the_typed_skips_are_pytest_skips() -> None:
    """``outcomes`` derives from ``_pytest.outcomes.Skipped``: fails loudly if pytest renames what it raises."""
    import _pytest.outcomes

    from lightning_optimizer.conformance.outcomes import NotApplicable, Unavailable

    assert pytest.skip.Exception is _pytest.outcomes.Skipped
    for kind in (NotApplicable, Unavailable):
        with pytest.raises(pytest.skip.Exception):
            raise kind("typed")


# -- required devices ----------------------------------------------------------------------------------


def test_required_device_that_is_unavailable_fails(reported: dict[str, Reported]) -> None:
    if MISSING_DEVICE is None:
        pytest.skip("unavailable: this machine has every device, so a required one cannot be missing")
    got = reported["required-device-unavailable"]
    assert got.run.returncode == 1, _explain(got.run)
    row = result(got.document, "test_wrapper_surface", f"{MISSING_DEVICE}/32-true/ws1")
    assert row["outcome"] == "failed", row
    assert row["reason"].startswith(f"device {MISSING_DEVICE} is required (--require-devices) but unavailable: ")
    assert ("CUDA" if MISSING_DEVICE == "cuda" else "torch_xla") in row["reason"]
    assert result(got.document, "test_wrapper_surface", "cpu/32-true/ws1")["outcome"] == "passed"
    assert got.document["summary"]["unavailable"] == 0
    assert got.document["required_devices"] == [MISSING_DEVICE]
    assert "required (--require-devices)" in got.run.stdout


def test_required_device_on_which_nothing_ran_fails_the_run(reported: dict[str, Reported]) -> None:
    """Every selected cell is n/a (the implementation claims only 64-true): the required device ran nothing."""
    got = reported["required-device-nothing-ran"]
    assert got.run.returncode == 1, _explain(got.run)
    assert got.document["results"] == []  # n/a in unclaimed cells: left out, counted
    assert got.document["summary"]["n/a_left_out"] > 0
    assert "cpu/32-true/ws1" in got.document["left_out"]["cells"]
    failure = "required device cpu: no check ran on it (--require-devices); select some of its cells"
    assert got.document["run_failures"] == [failure]
    assert f"run failed: {failure}" in got.run.stdout


# -- global state isolation ----------------------------------------------------------------------------


def _leak_rows(got: Reported) -> tuple[dict[str, Any], dict[str, Any]]:
    """The leaking cell's row and the next cell's, after checking that the leaking one ran first."""
    order = [row["precision"] for row in got.document["results"] if row["check"] == "test_wrapper_surface"]
    assert order == [LEAKING_PRECISION, "32-true"], order
    return (
        result(got.document, "test_wrapper_surface", f"cpu/{LEAKING_PRECISION}/ws1"),
        result(got.document, "test_wrapper_surface", "cpu/32-true/ws1"),
    )


@pytest.mark.parametrize("kind", list(LEAKS))
def test_leaked_state_fails_the_check_and_is_restored_for_the_next(reported: dict[str, Reported], kind: str) -> None:
    """The leaking check fails in teardown naming what leaked; the next cell's factory finds the state clean."""
    got = reported[f"leak-{kind}"]
    assert got.run.returncode == 1, _explain(got.run)
    leaked, following = _leak_rows(got)
    what, values = LEAKS[kind]
    assert leaked["outcome"] == "failed", leaked
    assert leaked["reason"].startswith("leaked global state (restored for the next check): "), leaked
    assert f"{what}: {values}" in leaked["reason"]
    assert following["outcome"] == "passed", following
    assert f"ERROR at teardown of test_wrapper_surface[cpu-{LEAKING_PRECISION}-ws1]" in got.run.stdout


def test_every_kind_of_leak_is_named_and_restored(reported: dict[str, Reported]) -> None:
    got = reported["leak-everything"]
    assert got.run.returncode == 1, _explain(got.run)
    leaked, following = _leak_rows(got)
    assert leaked["outcome"] == "failed", leaked
    for what, values in [*LEAKS.values(), *ALSO_LEAKED.items()]:
        assert f"{what}: {values}" in leaked["reason"], what
    assert "could not be restored" not in leaked["reason"]
    assert following["outcome"] == "passed", following


def test_restore_names_each_leak_with_its_values_and_undoes_it() -> None:
    """In this process: two settings and an environment variable changed, named, put back."""
    before = isolation.snapshot()
    threads = torch.get_num_threads()
    try:
        torch.set_default_dtype(torch.float64)
        torch.set_num_threads(threads + 1)
        os.environ["LIGHTNING_OPTIMIZER_RESTORE_TEST"] = "x" * 200
        leaks = isolation.restore(before)
    finally:
        isolation.restore(before)
    assert [str(leak) for leak in leaks] == [
        "default dtype: torch.float32 before the check, torch.float64 after",
        f"intra-op threads: {threads} before the check, {threads + 1} after",
        f"environment variable LIGHTNING_OPTIMIZER_RESTORE_TEST: unset before the check, '{'x' * 75}...' after",
    ]
    assert torch.get_default_dtype() == torch.float32
    assert torch.get_num_threads() == threads
    assert "LIGHTNING_OPTIMIZER_RESTORE_TEST" not in os.environ
    assert isolation.restore(before) == []


# -- options -------------------------------------------------------------------------------------------


def test_help_lists_the_suite_options(batch: dict[str, Run]) -> None:
    run = batch["help"]
    assert run.returncode == 0, _explain(run)
    for option in (
        "--expected-failures-file",
        "--strict-expected-failures",
        "--require-devices",
        "--property-examples",
        "--report-html",
        "--matrix={summary,full}",
    ):
        assert option in run.stdout, option
    help_text = " ".join(run.stdout.split())
    assert "an integer >= 1 (default: each check's fixed CI budget)" in help_text


# -- claims and filters --------------------------------------------------------------------------------


def test_unclaimed_precision_is_na_impl_from_environment(reported: dict[str, Reported]) -> None:
    """Claims ``64-true`` only; the implementation is named by ``LIGHTNING_OPTIMIZER_IMPL`` instead of ``--impl``.

    The n/a results of the unclaimed precisions are left out of the report and counted.
    """
    got = reported["only-fp64-from-env"]
    assert got.run.returncode == 0, _explain(got.run)
    assert got.document["impl"]["name"] == "fp64 only"
    assert got.document["claims"]["precisions"] == ["64-true"]
    assert [row["precision"] for row in got.document["results"]] == ["64-true"]
    assert result(got.document, "test_wrapper_surface", "cpu/64-true/ws1")["outcome"] == "passed"
    assert got.document["summary"]["passed"] == 1
    assert got.document["summary"]["n/a"] == 0
    assert got.document["summary"]["n/a_left_out"] == len(PRECISIONS) - 1
    assert got.document["left_out"]["cells"] == [f"cpu/{p}/ws1" for p in PRECISIONS if p != "64-true"]


def test_filters_limit_the_cells(reported: dict[str, Reported]) -> None:
    got = reported["filters"]
    assert got.run.returncode == 0, _explain(got.run)
    cells = {(row["device"], row["precision"], row["world_size"]) for row in got.document["results"]}
    assert cells == {(None, None, None), ("cpu", "32-true", 1)}
    outcomes = {row["check"]: row["outcome"] for row in got.document["results"]}
    assert outcomes == {
        "test_wrapper_surface": "passed",
        "test_context_surface": "passed",
        "test_static_surface": "n/a",
    }
    # the static check needs the record behind conformance_info; the alias makes it n/a, and cheap
    assert "conformance_info" in result(got.document, "test_static_surface", None)["reason"]
    assert "cpu/32-true/ws1" in got.run.stdout
    assert "cpu/64-true/ws1" not in got.run.stdout


# -- the reference: the report documents ---------------------------------------------------------------


def test_reference_exits_zero(reference: Reported) -> None:
    assert reference.run.returncode == 0, _explain(reference.run)


def test_reference_json_document(reference: Reported) -> None:
    document = reference.document
    info = reference_info()
    assert document["contract_version"] == CONTRACT_VERSION
    assert document["impl"] == {"name": info.name, "module": "lightning_optimizer.reference", "version": info.version}
    env = document["env"]
    assert env.keys() >= {"python", "torch", "torch_xla", "lightning", "devices_found"}
    assert env["torch"] == torch.__version__
    assert "cpu" in env["devices_found"]
    results = document["results"]
    for row in results:
        assert row.keys() >= RESULT_KEYS, row
        assert row["outcome"] in OUTCOMES, row
        assert isinstance(row["requirements"], list), row
        assert row["requirements"], row
        assert isinstance(row["duration_s"], float), row
        assert row["duration_s"] >= 0, row
    summary = document["summary"]
    assert set(summary) == {*OUTCOMES, "n/a_left_out"}
    assert summary["n/a_left_out"] == 0  # the reference claims every cell: nothing is left out
    assert document["left_out"]["cells"] == []
    assert sum(summary.values()) == len(results)
    for outcome in OUTCOMES:
        assert summary[outcome] == sum(row["outcome"] == outcome for row in results)
    # a cell check has one result in every cell of the matrix; the static check has one, without a cell. Above world
    # size 1 an XLA cell is SPMD, a CPU or CUDA one DDP or FSDP
    several = {"cpu": ("ddp", "fsdp"), "cuda": ("ddp", "fsdp"), "xla": ("spmd",)}
    matrix = {
        (device, precision, world_size, strategy)
        for device in DEVICE_KINDS
        for precision in PRECISIONS
        for world_size, strategy in ((1, "none"), *((2, strategy) for strategy in several[device]))
    }
    for check in ("test_wrapper_surface", "test_context_surface"):
        rows = [row for row in results if row["check"] == check]
        assert len(rows) == len(matrix)
        assert {(row["device"], row["precision"], row["world_size"], row["strategy"]) for row in rows} == matrix
    assert [row["device"] for row in results if row["check"] == "test_static_surface"] == [None]


def test_reference_outcomes_per_cell(reference: Reported) -> None:
    document = reference.document
    info = reference_info()
    unclaimed = next((p for p in PRECISIONS if p not in info.precisions), None)
    for check, requirement in (("test_wrapper_surface", "SURFACE-001"), ("test_context_surface", "SURFACE-002")):
        row = result(document, check, "cpu/32-true/ws1")
        assert (row["outcome"], row["reason"]) == ("passed", "")
        assert row["requirements"] == [requirement]
        assert row["duration_s"] > 0
        for precision in PRECISIONS:
            row = result(document, check, f"cpu/{precision}/ws1")
            if precision == unclaimed:
                assert (row["outcome"], row["reason"]) == ("n/a", f"not claimed (precision {unclaimed})")
            else:
                assert row["outcome"] == "passed", row
        for cell in ("cpu/32-true/ws2", "cpu/32-true/ws2-fsdp"):
            row = result(document, check, cell)
            assert row["outcome"] == "n/a"
            assert "world size 2" in row["reason"]
        row = result(document, check, "cuda/32-true/ws1")
        if "cuda" not in info.devices:
            assert row["outcome"] == "n/a"
        elif torch.cuda.is_available():
            assert row["outcome"] == "passed", row
        else:
            assert row["outcome"] == "unavailable", row
            assert "CUDA" in row["reason"]
    static = result(document, "test_static_surface", None)
    assert static["outcome"] == "passed", static
    assert static["device"] is static["precision"] is static["world_size"] is None
    assert static["requirements"] == ["SURFACE-001", "SURFACE-002"]


def test_reference_markdown(reference: Reported) -> None:
    markdown = reference.markdown
    assert markdown.startswith(f"# Conformance: {reference.document['impl']['name']}")
    header = next(line for line in markdown.splitlines() if line.startswith("| check | requirements |"))
    assert "any" in header
    assert "cpu/32-true/ws1" in header
    for check in ("test_wrapper_surface", "test_context_surface", "test_static_surface"):
        assert f"`{check}`" in markdown
    assert CONTRACT_VERSION in markdown


def test_reference_terminal_matrix(reference: Reported) -> None:
    out, summary = reference.run.stdout, reference.document["summary"]
    assert f"conformance: {reference.document['impl']['name']}" in out  # the report header
    assert "conformance matrix" in out
    matrix = out[out.index("conformance matrix") :]
    assert "test_wrapper_surface" not in matrix, "the per-check matrix is printed only with --matrix=full"
    assert "\ncpu/32-true/ws1 " in matrix
    assert "summary: " + ", ".join(f"{summary[o]} {o}" for o in OUTCOMES) in matrix
    assert "conformance report written to" in matrix
    too_wide = [line for line in out.splitlines() if len(line) > 120]
    assert not too_wide, too_wide


def test_reference_n_a_cells_are_deselected_and_skips_are_unavailable(reference: Reported) -> None:
    """pytest's closing line: n/a results are deselected, not skipped; every skip is an unavailable cell."""
    summary = reference.document["summary"]
    closing = reference.run.stdout.strip().splitlines()[-1]
    counts = {word: int(number) for number, word in re.findall(r"(\d+) (passed|skipped|deselected)", closing)}
    assert counts["passed"] == summary["passed"], closing
    assert counts.get("skipped", 0) == summary["unavailable"], closing
    assert counts["deselected"] >= summary["n/a"] + summary["n/a_left_out"] > 0, closing
    assert "n/a, deselected: " in reference.run.stdout


def test_reference_html_report(reference: Reported) -> None:
    page = (Path(reference.run.args[-1].removeprefix("--report-html="))).read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    assert '<table id="matrix">' in page and '<table id="groups">' in page
    for check in {row["check"] for row in reference.document["results"]}:
        assert f'<td class="name">{check}</td>' in page, check


def test_full_matrix_on_request(batch: dict[str, Run]) -> None:
    run = batch["full-matrix"]
    assert run.returncode == 0, _explain(run)
    matrix = run.stdout[run.stdout.index("conformance matrix") :].splitlines()
    header = next(line for line in matrix if line.startswith("check "))
    assert header.split()[:2] == ["check", "cpu/64-true/ws1"], matrix[:3]
    assert [line.split()[0] for line in matrix if line.startswith("test_")] == ["test_wrapper_surface"]


def test_reports_are_written_when_no_check_runs(tmp_path: Path) -> None:
    report = tmp_path / "empty.json"
    command = [sys.executable, "-m", "pytest", "conformance", "-k", "no_check_has_this_name", "-p", "no:cacheprovider"]
    run = _run([*command, f"--report-json={report}"], REPO, _env())
    assert run.returncode == 5, _explain(run)
    document = json.loads(report.read_text())
    assert document["results"] == []
    assert sum(document["summary"].values()) == 0
    assert "no check ran" in run.stdout
