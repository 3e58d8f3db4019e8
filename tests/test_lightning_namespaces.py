"""The reference's strategies in both of Lightning's namespaces, from one source.

``lightning_optimizer.reference.lightning`` is written against ``lightning.pytorch``; its twin
``lightning_optimizer.reference.pytorch_lightning`` is built from the same files with the imports rewritten
(``reference/twin_loader.py``). Checked here: a real fit and the registered names in each namespace (each in a
process of its own, ``LIGHTNING_NAMESPACE`` set), the rewrite itself, where the twin's tracebacks point, its typed
surface against the built package, and each package where only the other Lightning is installed. The whole Lightning
test suite runs in either namespace (``make lightning LIGHTNING_NAMESPACE=...``); these checks run in both, always.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import os
import subprocess
import sys
import textwrap
import traceback
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")
pytest.importorskip("pytorch_lightning", reason="the twin package needs pytorch-lightning, not installed")

from lightning_optimizer.conformance.harness import TOLERANCES
from lightning_optimizer.reference import module_optimizers, twin_loader
from lightning_optimizer.reference.twin_loader import SOURCE_PACKAGE, TWIN_PACKAGE

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
SOURCES = sorted((ROOT / "reference" / "lightning").glob("*.py"))
STUB = ROOT / "reference" / "pytorch_lightning.pyi"
# A hang guard on each subprocess here, never a speed check: each took under 16 s on 2 cores beside other jobs (load
# 3.5), under 23 s with two more processes spinning beside them; 600 s is 26 times that.
TIMEOUT_S = 600

sys.path.insert(0, str(TESTS))

from lightning_scenarios.shared import gan_batches  # noqa: E402
from test_lightning import gan_oracle  # noqa: E402

NAMESPACES = {
    "lightning": ("lightning.pytorch", SOURCE_PACKAGE),
    "pytorch_lightning": ("pytorch_lightning", TWIN_PACKAGE),
}
"""A namespace -> where its Trainer is, and the reference's package for it."""

REGISTERED = {
    "reference": ("strategies.ReferenceSingleDeviceStrategy", {}),
    "reference_ddp": ("strategies.ReferenceDDPStrategy", {}),
    "reference_ddp_find_unused_parameters_true": ("strategies.ReferenceDDPStrategy", {"find_unused_parameters": True}),
    "reference_ddp_spawn": ("strategies.ReferenceDDPStrategy", {"start_method": "spawn"}),
    "reference_xla": ("xla.ReferenceXLAStrategy", {}),
    "reference_fsdp": ("strategies.ReferenceFSDPStrategy", {}),
    "reference_ddp_spawn_find_unused_parameters_true": (
        "strategies.ReferenceDDPStrategy",
        {"start_method": "spawn", "find_unused_parameters": True},
    ),
}
"""What ``Trainer(strategy=name)`` is, by hand: the class (below the namespace's package) and its arguments."""


def twin() -> ModuleType:
    return importlib.import_module(TWIN_PACKAGE)


# -- a fit and the registry in each namespace ------------------------------------------------------------------


@pytest.mark.parametrize("namespace", NAMESPACES)
def test_the_gan_fits_and_the_names_are_registered_in_each_namespace(namespace: str, tmp_path: Path) -> None:
    """A real Trainer of the namespace trains the proposal's GAN on the namespace's package, as a plain loop does;
    the namespace's ``StrategyRegistry`` holds every name of ``STRATEGY_NAMES``, each building its class."""
    out = tmp_path / "result.pt"
    env = {**os.environ, "LIGHTNING_NAMESPACE": namespace, "PYTHONPATH": str(TESTS)}
    command = [sys.executable, "-m", "lightning_scenarios.namespace_fit", str(out)]
    completed = subprocess.run(command, env=env, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    assert completed.returncode == 0, completed.stderr[-4000:]
    result: dict[str, Any] = torch.load(out)

    trainer_root, package = NAMESPACES[namespace]
    assert result["trainer"].startswith(f"{trainer_root}.trainer."), result["trainer"]
    assert result["strategy"] == result["strategy_class"] == f"{package}.strategies.ReferenceSingleDeviceStrategy"
    assert result["registered"] == {
        name: {"strategy": f"{package}.{kind}", "init_params": params} for name, (kind, params) in REGISTERED.items()
    }
    assert result["by_name"] == {
        name: f"{package}.{kind}" for name, (kind, _) in REGISTERED.items() if name != "reference_xla"
    }
    oracle = gan_oracle("32-true", gan_batches())
    tolerance = TOLERANCES["32-true"]
    for got, want in zip(result["params"], oracle.model.parameters(), strict=True):
        torch.testing.assert_close(got, want.detach(), rtol=tolerance.rtol, atol=tolerance.atol)
    assert result["global_step"] == oracle.closing_steps == 2 * (5 + 3)


# -- the twin: the same files, imports rewritten ------------------------------------------------------------------


def lightning_imports(tree: ast.AST) -> list[str]:
    """The modules a source imports that belong to one of Lightning's distributions."""
    found = []
    for node in ast.walk(tree):
        names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            names = [node.module]
        found += [
            name for name in names if name.split(".")[0] in ("lightning", "pytorch_lightning", "lightning_fabric")
        ]
    return found


@pytest.mark.parametrize("source", SOURCES, ids=lambda path: path.name)
def test_the_twin_is_the_source_with_its_lightning_imports_rewritten(source: Path) -> None:
    """The source imports ``lightning.pytorch`` and ``lightning.fabric`` only; the twin, the standalone packages
    and its own modules only, every line where it was."""
    text = source.read_text(encoding="utf-8")
    rewritten = twin_loader.rewrite(text)
    assert len(rewritten.splitlines()) == len(text.splitlines())
    for before, after in zip(text.splitlines(), rewritten.splitlines(), strict=True):
        assert (before == after) or ("lightning" in before), "a line without Lightning changed"

    imported = lightning_imports(ast.parse(text))
    assert all(name.startswith(("lightning.pytorch", "lightning.fabric")) for name in imported), imported
    twin_imports = lightning_imports(ast.parse(rewritten))
    assert all(name.split(".")[0] in ("pytorch_lightning", "lightning_fabric") for name in twin_imports), twin_imports
    own = [
        node.module
        for node in ast.walk(ast.parse(rewritten))
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_optimizer.")
    ]
    assert not [name for name in own if name.startswith(SOURCE_PACKAGE)], own


def test_the_twin_is_built_from_the_source_files_on_the_standalone_classes() -> None:
    """Each module of the twin is one of the package's files; its classes subclass ``pytorch_lightning``'s only."""
    import pytorch_lightning

    package = twin()
    modules = {name: module for name, module in sys.modules.items() if name.startswith(TWIN_PACKAGE)}
    assert {Path(module.__file__ or "").resolve() for module in modules.values()} == {p.resolve() for p in SOURCES}
    source_all = next(
        ast.literal_eval(node.value)
        for node in ast.parse((ROOT / "reference" / "lightning" / "__init__.py").read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
    )
    assert package.__all__ == source_all
    for name in (
        "ReferenceSingleDeviceStrategy",
        "ReferenceDDPStrategy",
        "ReferenceFSDPStrategy",
        "ReferenceXLAStrategy",
    ):
        strategy = getattr(package, name)
        assert issubclass(strategy, pytorch_lightning.strategies.Strategy)
        roots = {kind.__module__.split(".")[0] for kind in strategy.__mro__}
        assert "lightning" not in roots, f"{name} subclasses lightning.pytorch classes: {strategy.__mro__}"
    assert package.wrapped_optimizers is module_optimizers.wrapped_optimizers


def test_a_traceback_from_the_twin_points_at_the_source_line() -> None:
    with pytest.raises(TypeError, match=r"mixed_precision=\.\.\.") as raised:
        twin().ReferenceDDPStrategy(mixed_precision=object())
    frames = traceback.extract_tb(raised.value.__traceback__)
    where = [frame for frame in frames if frame.filename.endswith("strategies.py")]
    assert where, [frame.filename for frame in frames]
    frame = where[-1]
    assert Path(frame.filename).resolve() == (ROOT / "reference" / "lightning" / "strategies.py").resolve()
    assert frame.lineno is not None
    source_line = SOURCES[[p.name for p in SOURCES].index("strategies.py")].read_text().splitlines()[frame.lineno - 1]
    assert frame.line == source_line.strip()
    assert "raise TypeError" in source_line


# -- the twin's typed surface ---------------------------------------------------------------------------------------


def stub_classes() -> dict[str, ast.ClassDef]:
    return {
        node.name: node for node in ast.parse(STUB.read_text(encoding="utf-8")).body if isinstance(node, ast.ClassDef)
    }


def stub_all() -> list[str]:
    for node in ast.parse(STUB.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets):
            return list(ast.literal_eval(node.value))
    raise AssertionError("the stub has no __all__")


def parameters(arguments: ast.arguments) -> list[tuple[str, str]]:
    found = [(a.arg, "POSITIONAL_OR_KEYWORD") for a in arguments.args]
    found += [("*" + arguments.vararg.arg, "VAR_POSITIONAL")] if arguments.vararg else []
    found += [(a.arg, "KEYWORD_ONLY") for a in arguments.kwonlyargs]
    found += [("**" + arguments.kwarg.arg, "VAR_KEYWORD")] if arguments.kwarg else []
    return found


def signature_of(function: Any) -> list[tuple[str, str]]:
    prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    return [
        (prefix.get(p.kind.name, "") + name, p.kind.name) for name, p in inspect.signature(function).parameters.items()
    ]


def test_the_twin_stub_declares_the_built_package() -> None:
    """``reference/pytorch_lightning.pyi`` (what mypy sees of the twin): the package's names, each class on the
    standalone class it subclasses, with the constructor it has and the public members it adds (every one of them)."""
    import pytorch_lightning.accelerators
    import pytorch_lightning.plugins.precision
    import pytorch_lightning.strategies
    import pytorch_lightning.strategies.single_xla

    package = twin()
    assert sorted(stub_all()) == sorted(package.__all__)
    bases = {
        "SingleDeviceStrategy": pytorch_lightning.strategies.SingleDeviceStrategy,
        "DDPStrategy": pytorch_lightning.strategies.DDPStrategy,
        "ModelParallelStrategy": pytorch_lightning.strategies.ModelParallelStrategy,
        "SingleDeviceXLAStrategy": pytorch_lightning.strategies.single_xla.SingleDeviceXLAStrategy,
        "XLAAccelerator": pytorch_lightning.accelerators.XLAAccelerator,
        "Precision": pytorch_lightning.plugins.precision.Precision,
    }
    classes = stub_classes()
    assert sorted(classes) == sorted(name for name in package.__all__ if isinstance(getattr(package, name), type))
    for name, node in classes.items():
        real = getattr(package, name)
        (base,) = node.bases
        assert isinstance(base, ast.Name)
        assert issubclass(real, bases[base.id]), f"{name} does not subclass {base.id}"
        declared = set()
        for member in node.body:
            if isinstance(member, ast.FunctionDef) and member.name == "__init__":
                assert parameters(member.args) == signature_of(real.__init__), name
            elif isinstance(member, ast.FunctionDef):
                declared.add(member.name)
                static = inspect.getattr_static(real, member.name)
                decorators = {ast.unparse(decorator) for decorator in member.decorator_list}
                kind = classmethod if "classmethod" in decorators else property if "property" in decorators else None
                if kind is None:
                    assert inspect.isfunction(static), f"{name}.{member.name} is not a method"
                else:
                    assert isinstance(static, kind), f"{name}.{member.name} is not a {kind.__name__}"
            elif isinstance(member, ast.AnnAssign) and isinstance(member.target, ast.Name):
                declared.add(member.target.id)
                assert hasattr(real(), member.target.id), f"{name}.{member.target.id}"
        # Every public member the reference adds to the Lightning class (not an override of one it has) is declared.
        added = {
            attribute
            for klass in real.__mro__
            if klass.__module__.startswith(package.__name__)
            for attribute in vars(klass)
            if not attribute.startswith("_") and not hasattr(bases[base.id], attribute)
        }
        assert added <= declared, f"{name}: public members the stub does not declare: {sorted(added - declared)}"


# -- each package where only the other Lightning is installed ------------------------------------------------------


def without(blocked: tuple[str, ...], body: str) -> dict[str, Any]:
    """Run ``body`` in a fresh interpreter where the modules ``blocked`` cannot be imported; its printed JSON."""
    program = textwrap.dedent(
        f"""
        import json, sys

        class Missing:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] in {blocked!r}:
                    raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
                return None

        sys.meta_path.insert(0, Missing())
        """
    ) + textwrap.dedent(body)
    env = {key: value for key, value in os.environ.items() if key != "LIGHTNING_NAMESPACE"}
    completed = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=TIMEOUT_S, check=False, env=env
    )
    assert completed.returncode == 0, completed.stderr[-4000:]
    result: dict[str, Any] = json.loads(completed.stdout.strip().splitlines()[-1])
    return result


FIT_AND_REFUSE = """
import importlib
import torch
from lightning_optimizer.reference import WrappedOptimizer

found = {}
try:
    importlib.import_module(REFUSED)
except ModuleNotFoundError as error:
    found["refused"] = [error.name, str(error)]
reference = importlib.import_module(WORKS)
trainer_module = importlib.import_module(TRAINER)

class Regressor(trainer_module.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure):
        found["wrapped"] = isinstance(optimizer, WrappedOptimizer) and type(optimizer.optimizer) is torch.optim.SGD
        optimizer.step(closure=optimizer_closure)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

data = torch.utils.data.TensorDataset(torch.randn(8, 2), torch.randn(8, 1))
trainer = trainer_module.Trainer(
    strategy="reference", accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False, accumulate_grad_batches=2,
)
trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=2))
found["strategy"] = type(trainer.strategy).__module__
found["global_step"] = trainer.global_step
found["loaded"] = sorted({name.split(".")[0] for name in sys.modules if "lightning" in name.split(".")[0]})
print(json.dumps(found))
"""


@pytest.mark.parametrize(
    ("installed", "blocked"),
    [("pytorch_lightning", ("lightning",)), ("lightning", ("pytorch_lightning", "lightning_fabric"))],
    ids=["pytorch-lightning-only", "lightning-only"],
)
def test_each_package_works_where_only_its_lightning_is_installed(installed: str, blocked: tuple[str, ...]) -> None:
    """With one distribution missing, its package says what to install and names the other, which trains."""
    trainer, works = NAMESPACES[installed]
    refused = TWIN_PACKAGE if works == SOURCE_PACKAGE else SOURCE_PACKAGE
    setup = f"REFUSED, WORKS, TRAINER = {refused!r}, {works!r}, {trainer!r}\n"
    found = without(blocked, setup + FIT_AND_REFUSE)

    name, message = found["refused"]
    assert name == blocked[0]
    extra = "lightning" if refused == SOURCE_PACKAGE else "pytorch-lightning"
    assert message.startswith(f"{refused} needs the "), message
    assert f"pip install 'lightning-optimizer[{extra}]'" in message
    assert f"use {works}" in message
    assert found["strategy"] == f"{works}.strategies"
    assert found["wrapped"], "optimizer_step was not handed the reference's wrapper"
    assert found["global_step"] == 2
    assert not set(found["loaded"]) & set(blocked)
