"""``scripts/lightning-own-tests`` without Lightning's repository: its import rewrite, its verdicts, its swap.

The harness itself runs Lightning's own test files (``make lightning-own-tests``); here its parts are checked on
inputs written by hand, so that a change to them fails in ``make test``.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

pytest.importorskip("lightning", reason="the harness drives Lightning, not installed")

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the harness's package (``lightning_own``), as the scenarios' tests do


def _script() -> ModuleType:
    loader = importlib.machinery.SourceFileLoader("lightning_own_tests", str(REPO / "scripts" / "lightning-own-tests"))
    spec = importlib.util.spec_from_loader("lightning_own_tests", loader)
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests_pytorch.core.test_lightning_optimizer" name="test_state"/>
<testcase classname="tests_pytorch.core.test_lightning_optimizer" name="test_lightning_optimizer">
  <failure message="assert 'WrappedSGD' == 'LightningSGD'&#10;more">trace</failure></testcase>
<testcase classname="tests_pytorch.trainer.optimization.test_manual_optimization" name="test_a[gpu]">
  <skipped message="Requires: [GPUs&gt;=1]"/></testcase>
<testcase classname="tests_pytorch.trainer.optimization.test_manual_optimization" name="test_b">
  <error message="boom">trace</error></testcase>
</testsuite></testsuites>
"""


def test_outcomes_and_verdicts_from_a_junit_report(tmp_path: Path) -> None:
    script = _script()
    junit = tmp_path / "junit.xml"
    junit.write_text(JUNIT, encoding="utf-8")
    found = script.outcomes(junit)
    assert found == {
        "core/test_lightning_optimizer.py::test_state": ("passed", ""),
        "core/test_lightning_optimizer.py::test_lightning_optimizer": (
            "failed",
            "assert 'WrappedSGD' == 'LightningSGD'",
        ),
        "trainer/optimization/test_manual_optimization.py::test_a[gpu]": ("skipped", "Requires: [GPUs>=1]"),
        "trainer/optimization/test_manual_optimization.py::test_b": ("failed", "boom"),
    }
    plain = {**found, "trainer/optimization/test_manual_optimization.py::test_b": ("passed", "")}
    plain["core/test_lightning_optimizer.py::test_lightning_optimizer"] = ("passed", "")
    plain["core/test_lightning_optimizer.py::test_plain_fails"] = ("failed", "needs a GPU")
    reference = {**found, "core/test_lightning_optimizer.py::test_plain_fails": ("failed", "needs a GPU")}
    may_differ = {
        "core/test_lightning_optimizer.py::test_lightning_optimizer": {"class": "internal", "reason": "the class name"},
        "core/test_lightning_optimizer.py::test_state": {"class": "divergence", "reason": "listed, but it passes"},
        "core/test_lightning_optimizer.py::test_gone": {"class": "internal", "reason": "listed, not collected"},
    }
    lines = script.compare(plain, reference, may_differ)
    unexpected = sorted(line.split()[2].rstrip(":") for line in lines if line.startswith("!!"))
    assert unexpected == [
        "core/test_lightning_optimizer.py::test_gone",  # listed, not collected
        "core/test_lightning_optimizer.py::test_state",  # listed, passes now
        "trainer/optimization/test_manual_optimization.py::test_b",  # passes plain, fails with the reference
    ]
    expected = [line.split()[:2] for line in lines if not line.startswith("!!")]
    assert ["internal", "core/test_lightning_optimizer.py::test_lightning_optimizer:"] in expected
    assert ["plain-failed", "core/test_lightning_optimizer.py::test_plain_fails:"] in expected
    assert ["plain-skipped", "trainer/optimization/test_manual_optimization.py::test_a[gpu]:"] in expected
    assert len(lines) == 6, "a test passed on both sides and unlisted is not a line"

    table = script.per_file(plain, reference)
    assert table[2] == "| core/test_lightning_optimizer.py | 2 | 1 | 0 | 1 | 2 | 0 |"
    assert table[3] == "| trainer/optimization/test_manual_optimization.py | 1 | 0 | 1 | 0 | 1 | 1 |"
    assert table[-1] == "| all | 3 | 1 | 1 | 1 | 3 | 1 |"


def test_the_import_rewrite_targets_the_standalone_packages(tmp_path: Path) -> None:
    script = _script()
    text = (
        "from lightning import Trainer\nimport lightning.fabric\nfrom lightning.pytorch.core import LightningModule\n"
    )
    rewritten = text
    for pattern, replacement in script._IMPORTS:
        rewritten = pattern.sub(replacement, rewritten)
    assert rewritten.splitlines() == [
        "from pytorch_lightning import Trainer",
        "import lightning_fabric",
        "from pytorch_lightning.core import LightningModule",
    ]


def test_expected_outcomes_name_a_pinned_tag_and_a_class_and_reason_for_each_difference() -> None:
    script = _script()
    expected = json.loads((REPO / "tests" / "lightning_own" / "expected.json").read_text(encoding="utf-8"))
    assert expected["tag"].count(".") == 2
    assert all(path.startswith("tests/tests_pytorch/") for path in expected["files"] + expected["support"])
    assert expected["may_differ"]
    for function, entry in expected["may_differ"].items():
        assert "::" in function and "[" not in function, f"{function}: a test function, parameters left out"
        assert entry["class"] in script.CLASSES, f"{function}: class {entry['class']!r}"
        assert len(entry["reason"]) > 40, f"{function}: a reason of one real line"


def test_the_swap_gives_single_device_cpu_trainers_the_reference_strategy(tmp_path: Path) -> None:
    from lightning.pytorch import Trainer
    from lightning_own import reference_swap

    from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

    try:
        single = Trainer(default_root_dir=tmp_path, logger=False, enable_checkpointing=False)
        other = Trainer(default_root_dir=tmp_path, strategy="ddp", devices=2, accelerator="cpu", logger=False)
        assert isinstance(single.strategy, ReferenceSingleDeviceStrategy)
        assert not isinstance(other.strategy, ReferenceSingleDeviceStrategy)
        assert [single] == reference_swap.SWAPPED
    finally:
        Trainer.__init__ = reference_swap._lightning_init  # type: ignore[method-assign]


def test_the_listed_folders_and_files_give_the_test_files_a_pattern_selects(tmp_path: Path) -> None:
    script = _script()
    tests = tmp_path / "tests"
    names = ("loops/test_a.py", "loops/optimization/test_b.py", "loops/helper.py", "core/test_c.py", "core/test_d.py")
    for name in names:
        (tests / "tests_pytorch" / name).parent.mkdir(parents=True, exist_ok=True)
        (tests / "tests_pytorch" / name).write_text("", encoding="utf-8")
    listed = ["tests/tests_pytorch/loops", "tests/tests_pytorch/core/test_c.py"]
    assert script.test_files(tests, listed, None) == [
        "tests_pytorch/loops/optimization/test_b.py",
        "tests_pytorch/loops/test_a.py",
        "tests_pytorch/core/test_c.py",
    ]
    assert script.test_files(tests, listed, ["test_b", "core/"]) == [
        "tests_pytorch/loops/optimization/test_b.py",
        "tests_pytorch/core/test_c.py",
    ]
