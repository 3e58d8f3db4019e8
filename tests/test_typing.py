"""Static typing of the contract, checked with the real mypy --strict.

tests/typing/pass/ holds user code that must type-check cleanly; tests/typing/fail/misuse.py holds one misuse
per line, each followed by ``# type: ignore[<code>]`` naming exactly the error mypy must raise there. mypy runs
at most four times per session, on a shared cache (the first run, which reads torch, takes the longest).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import pytest
import torch

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import StepOutcome

ROOT = Path(__file__).resolve().parents[1]
TYPING = ROOT / "tests" / "typing"
PASS_DIR = TYPING / "pass"
MISUSE = TYPING / "fail" / "misuse.py"
PASS_FILES = (
    "assert_types.py",
    "backward_then_step.py",
    "closure_step.py",
    "gan.py",
    "hooks.py",
    "implementation_info.py",
    "lightning_gan.py",
    "pytorch_lightning_gan.py",
)

# A hang guard, never a speed check: the longest mypy run here took 34 s on 2 cores beside other jobs (load 3.5); 900 s
# is 26 times that.
TIMEOUT_S = 900
IGNORE = re.compile(r"\s*# type: ignore\[(?P<codes>[^\]]+)\]\s*$")
DIAGNOSTIC = re.compile(
    r"^(?P<path>.+?):(?P<line>\d+): (?P<kind>error|note): (?P<message>.*?)(?:  \[(?P<code>[a-z-]+)\])?$"
)


@dataclass(frozen=True)
class Diagnostic:
    path: Path
    line: int
    kind: str
    message: str
    code: str | None


@dataclass(frozen=True)
class MypyRun:
    returncode: int
    output: str
    diagnostics: tuple[Diagnostic, ...]

    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.kind == "error"]

    def describe(self) -> str:
        return f"mypy exited {self.returncode}:\n{self.output}"


def run_mypy(cache_dir: Path, *paths: Path) -> MypyRun:
    command = [
        sys.executable,
        "-m",
        "mypy",
        f"--config-file={ROOT / 'mypy.ini'}",
        "--strict",
        "--warn-unused-ignores",
        "--show-error-codes",
        "--show-absolute-path",
        "--no-color-output",
        "--no-pretty",
        f"--cache-dir={cache_dir}",
        *(str(path) for path in paths),
    ]
    completed = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=TIMEOUT_S, check=False)
    output = completed.stdout + completed.stderr
    diagnostics = []
    for line in completed.stdout.splitlines():
        match = DIAGNOSTIC.match(line)
        if match is not None:
            diagnostics.append(
                Diagnostic(
                    Path(match["path"]).resolve(),
                    int(match["line"]),
                    match["kind"],
                    match["message"],
                    match["code"],
                )
            )
    return MypyRun(completed.returncode, output, tuple(diagnostics))


def expected_ignores(source: str) -> dict[int, set[str]]:
    """Line number -> the error codes named by that line's ``# type: ignore[...]`` comment."""
    expected = {}
    for number, line in enumerate(source.splitlines(), start=1):
        match = IGNORE.search(line)
        if match is not None:
            expected[number] = {code.strip() for code in match["codes"].split(",")}
    return expected


@pytest.fixture(scope="session")
def mypy_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("mypy-cache")


@pytest.fixture(scope="session")
def misuse_source() -> str:
    return MISUSE.read_text(encoding="utf-8")


# -- the pass folder -----------------------------------------------------------------------------------


def test_pass_files_are_present() -> None:
    assert sorted(path.name for path in PASS_DIR.glob("*.py")) == sorted(PASS_FILES)


def test_pass_folder_type_checks(mypy_cache: Path) -> None:
    run = run_mypy(mypy_cache, PASS_DIR)
    assert run.returncode == 0, run.describe()
    assert not run.errors(), run.describe()
    assert f"no issues found in {len(PASS_FILES)} source files" in run.output, run.describe()


# -- the fail file -------------------------------------------------------------------------------------


def test_misuse_file_names_the_expected_codes(misuse_source: str) -> None:
    expected = expected_ignores(misuse_source)
    assert len(expected) >= 8, expected
    assert set().union(*expected.values()) >= {"call-overload", "call-arg", "attr-defined", "assignment", "arg-type"}
    for number in expected:
        line = misuse_source.splitlines()[number - 1]
        assert not line.rstrip().endswith(("(", ",")), f"misuse on line {number} spans several lines: {line!r}"


def test_misuse_file_is_covered_by_its_exact_ignores(mypy_cache: Path) -> None:
    run = run_mypy(mypy_cache, MISUSE)
    assert run.returncode == 0, run.describe()
    assert not run.errors(), run.describe()


def test_every_ignore_is_load_bearing(mypy_cache: Path, misuse_source: str, tmp_path: Path) -> None:
    """Strip every ignore comment: mypy must report exactly the named codes on exactly those lines."""
    expected = expected_ignores(misuse_source)
    stripped = tmp_path / "stripped_misuse.py"
    stripped.write_text("".join(IGNORE.sub("", line) + "\n" for line in misuse_source.splitlines()), encoding="utf-8")
    assert "type: ignore" not in stripped.read_text(encoding="utf-8")

    run = run_mypy(mypy_cache, stripped)
    assert run.returncode == 1, run.describe()
    reported: dict[int, set[str]] = {}
    for error in run.errors():
        assert error.path == stripped.resolve(), run.describe()
        assert error.code is not None, f"error without a code on line {error.line}:\n{run.describe()}"
        reported.setdefault(error.line, set()).add(error.code)
    assert reported == expected, run.describe()

    # The class assigned to OptimizerWrapper[SGD] fails for the one member it lacks, and only for that.
    (assignment_line,) = (number for number, codes in expected.items() if codes == {"assignment"})
    notes = [d.message.strip() for d in run.diagnostics if d.kind == "note" and d.line == assignment_line]
    assert notes == ['"NoBackward" is missing following "OptimizerWrapper" protocol member:', "backward"], (
        run.describe()
    )


def test_a_corrected_misuse_leaves_an_unused_ignore(mypy_cache: Path, misuse_source: str, tmp_path: Path) -> None:
    lines = misuse_source.splitlines()
    (number,) = (i for i, line in enumerate(lines, start=1) if 'make_optimizer_step="yes"' in line)
    lines[number - 1] = lines[number - 1].replace('make_optimizer_step="yes"', "make_optimizer_step=True")
    assert "# type: ignore[call-overload]" in lines[number - 1]
    corrected = tmp_path / "corrected_misuse.py"
    corrected.write_text("\n".join(lines) + "\n", encoding="utf-8")

    run = run_mypy(mypy_cache, corrected)
    assert run.returncode == 1, run.describe()
    assert [(error.line, error.code) for error in run.errors()] == [(number, "unused-ignore")], run.describe()


# -- the pass files at run time ------------------------------------------------------------------------


def load_pass_module(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"typing_pass_{name}", PASS_DIR / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _sgd_setup() -> tuple[torch.nn.Module, TrainingContext, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    ctx = TrainingContext(precision="32-true", device="cpu")
    model = ctx.prepare_module(torch.nn.Linear(3, 1))
    return model, ctx, torch.randn(8, 3), torch.randn(8, 1)


def test_gan_runs_with_the_reference() -> None:
    gan = load_pass_module("gan")
    outcomes = gan.main(batches=8)
    stepped, accumulated = StepOutcome.STEPPED, StepOutcome.ACCUMULATED
    assert outcomes["gen"] == [stepped, accumulated] * 4
    assert outcomes["dis"] == [stepped, None, None, None] * 2


def test_closure_step_runs_with_the_reference() -> None:
    closure_step = load_pass_module("closure_step")
    model, ctx, x, y = _sgd_setup()
    opt = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]

    outcomes = []
    loss = closure_step.training_step(model, opt, (x, y), batch_idx=1)
    outcomes.append(opt.last_outcome)
    assert isinstance(loss, torch.Tensor)
    assert not loss.requires_grad
    assert all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    closure_step.training_step(model, opt, (x, y), batch_idx=2)
    outcomes.append(opt.last_outcome)
    assert not all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    total = closure_step.training_step_positional(model, opt, x, y)
    outcomes.append(opt.last_outcome)
    assert isinstance(total, float)
    assert outcomes == [StepOutcome.ACCUMULATED, StepOutcome.STEPPED, StepOutcome.STEPPED]


def test_backward_then_step_runs_with_the_reference() -> None:
    backward_then_step = load_pass_module("backward_then_step")
    model, ctx, x, y = _sgd_setup()
    opt = ctx.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]

    assert backward_then_step.training_step(model, opt, x, y) is StepOutcome.STEPPED
    assert not all(torch.equal(b, p) for b, p in zip(before, model.parameters(), strict=True))

    outcomes = []
    for batch_idx in range(4):
        backward_then_step.accumulate_without_sync(model, opt, x, y, batch_idx)
        outcomes.append(opt.last_outcome)
    assert outcomes == [StepOutcome.ACCUMULATED] * 3 + [StepOutcome.STEPPED]

    backward_then_step.no_sync_block(model, opt, x)
    assert opt.last_outcome is StepOutcome.ACCUMULATED
