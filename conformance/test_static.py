"""The static surface: mypy --strict accepts the implementation's factory as the contract's protocols."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from lightning_optimizer.conformance.outcomes import not_applicable
from lightning_optimizer.spec import ImplementationInfo, check_factory

SNIPPET = """\
from typing import reveal_type

import torch

from lightning_optimizer.spec import Cell, GradScalerSettings, OptimizerWrapper, TrainingContext
from {module} import conformance_info


def check_factory() -> None:
    concrete = conformance_info().factory(
        Cell("cpu", "32-true"),
        accumulate_grad_batches=2,
        gradient_clip_val=1.0,
        gradient_clip_algorithm="value",
        grad_scaler=GradScalerSettings(),
    )
    reveal_type(concrete)
    context: TrainingContext = concrete
    model = concrete.prepare_module(torch.nn.Linear(2, 1))
    sgd: OptimizerWrapper[torch.optim.SGD] = concrete.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    adam: OptimizerWrapper[torch.optim.Optimizer] = concrete.wrap(torch.optim.Adam(model.parameters()))
    del context, sgd, adam
"""


@pytest.mark.requirement("SURFACE-001", "SURFACE-002")
@pytest.mark.varies(optimizer=("SGD", "Adam"))
def test_static_surface(implementation: ImplementationInfo[Any], pytestconfig: pytest.Config, tmp_path: Path) -> None:
    """The factory takes the suite's call; mypy --strict accepts its context and wrappers as the protocols."""
    try:
        check_factory(implementation.factory)
    except TypeError as error:
        pytest.fail(str(error), pytrace=False)
    module = pytestconfig.getoption("impl").partition(":")[0]
    if pytestconfig.getoption("impl").partition(":")[2] not in ("", "conformance_info"):
        not_applicable("the static check needs the record behind a function named conformance_info")
    snippet = tmp_path / "check_static_surface.py"
    snippet.write_text(SNIPPET.format(module=module), encoding="utf-8")
    # MYPYPATH gets the folder that holds the module, unless it is installed.
    env, file = dict(os.environ), getattr(sys.modules[module], "__file__", None)
    if file is not None:
        root = Path(file).parents[module.count(".") + (Path(file).name == "__init__.py")]
        if root not in {Path(p) for p in sys.path if "site-packages" in p or "__editable__" in p}:
            env["MYPYPATH"] = str(root)
    # mypy's own MYPY_CACHE_DIR chooses the cache where it is set; else pytest's cache keeps it between runs.
    store = getattr(pytestconfig, "cache", None)
    cache = store.mkdir("mypy") if store is not None else tmp_path / "mypy-cache"
    cache = Path(os.environ.get("MYPY_CACHE_DIR") or cache)
    command = [sys.executable, "-m", "mypy", "--strict", "--config-file=", f"--cache-dir={cache}"]
    command += ["--no-error-summary", "--hide-error-context", "--follow-imports=silent", str(snippet)]
    completed = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)
    lines = [line.replace(str(snippet), "snippet") for line in completed.stdout.splitlines()]
    revealed = [line for line in lines if "Revealed type" in line]
    errors = [line for line in lines if ": error:" in line]
    assert not errors, "mypy --strict rejects the implementation as the contract:\n" + textwrap.indent(
        "\n".join(lines), "  "
    )
    assert revealed, f"mypy did not check the snippet (exit {completed.returncode}):\n{completed.stderr}"
    assert "Any" not in revealed[0], (
        f"{module}.conformance_info() is not precisely typed ({revealed[0].split(': ')[-1]}): annotate it "
        "as returning ImplementationInfo[YourContext] so that mypy can check the context and its wrappers"
    )
