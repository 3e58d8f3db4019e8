"""The Lightning namespace the Lightning tests, their scenarios and the examples run in (test infrastructure only).

They are written as Lightning's documentation writes user code, against the ``lightning`` distribution:
``lightning.pytorch``, ``lightning.fabric`` and the reference's ``lightning_optimizer.reference.lightning``. With
``LIGHTNING_NAMESPACE=pytorch_lightning`` in the environment, :func:`install` (run when ``lightning_scenarios`` is
imported: by ``tests/conftest.py``, by each scenario subprocess, by :mod:`lightning_scenarios.example`) puts a finder
first on ``sys.meta_path`` that answers, before anything imports them,

- ``lightning`` with a module of the standalone packages: ``lightning.pytorch`` is ``pytorch_lightning``,
  ``lightning.fabric`` is ``lightning_fabric``, and ``Trainer``, ``LightningModule``, ... are theirs;
- ``lightning.pytorch.*`` and ``lightning.fabric.*`` with the modules of ``pytorch_lightning`` and
  ``lightning_fabric`` themselves (the same objects, so every class is the standalone one);
- ``lightning_optimizer.reference.lightning`` and its modules with the twin,
  ``lightning_optimizer.reference.pytorch_lightning``;

and ``logging.getLogger("lightning.pytorch")`` (``"lightning.fabric"``) returns the standalone package's logger.

So the same test files run a real ``pytorch_lightning.Trainer`` on the twin's strategies, and the ``lightning``
distribution's own modules are never imported in that run. Without the variable (or with ``lightning``) nothing
changes. Any other value is refused.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import logging
import os
import sys
from collections.abc import Sequence
from types import ModuleType

ENVIRONMENT = "LIGHTNING_NAMESPACE"
NAMESPACES = ("lightning", "pytorch_lightning")

ALIASES = (
    ("lightning.pytorch", "pytorch_lightning"),
    ("lightning.fabric", "lightning_fabric"),
    ("lightning_optimizer.reference.lightning", "lightning_optimizer.reference.pytorch_lightning"),
)
"""A module name's prefix in the test files, and what it names in the ``pytorch_lightning`` run."""

TOP_LEVEL = {
    "Trainer": "pytorch_lightning",
    "LightningModule": "pytorch_lightning",
    "LightningDataModule": "pytorch_lightning",
    "Callback": "pytorch_lightning",
    "Fabric": "lightning_fabric",
    "seed_everything": "lightning_fabric",
}
"""The names ``import lightning as L`` gives (``L.Trainer``, ...), and the standalone package each is taken from."""


def selected() -> str:
    """The namespace of this run: ``LIGHTNING_NAMESPACE``, ``lightning`` when it is not set."""
    namespace = os.environ.get(ENVIRONMENT, "lightning") or "lightning"
    if namespace not in NAMESPACES:
        raise ValueError(f"{ENVIRONMENT}={namespace!r}: set it to one of {', '.join(NAMESPACES)} (or leave it unset)")
    return namespace


def installed_version() -> tuple[int, ...]:
    """The release of the Lightning distribution of this run's namespace (``lightning`` or ``pytorch-lightning``)."""
    from importlib.metadata import version

    release = version("lightning" if selected() == "lightning" else "pytorch-lightning")
    return tuple(int(part) for part in release.split("+")[0].split(".")[:3] if part.isdigit())


def target_of(name: str) -> str | None:
    """The module that ``name`` stands for in the ``pytorch_lightning`` run, ``None`` when it is not aliased."""
    for prefix, target in ALIASES:
        if name == prefix or name.startswith(prefix + "."):
            return target + name[len(prefix) :]
    return None


class _Existing(importlib.abc.Loader):
    """Hands the import system a module that exists already (the standalone package's), leaving its spec alone."""

    def __init__(self, module: ModuleType) -> None:
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return self.module

    def exec_module(self, module: ModuleType) -> None:
        module.__spec__ = self.spec  # the import system set the alias's spec on it


class _Lightning(importlib.abc.Loader):
    """Makes the ``lightning`` package of the ``pytorch_lightning`` run."""

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return ModuleType("lightning", "The standalone pytorch_lightning and lightning_fabric under lightning's names.")

    def exec_module(self, module: ModuleType) -> None:
        for name, package in TOP_LEVEL.items():
            setattr(module, name, getattr(importlib.import_module(package), name))
        module.__version__ = importlib.import_module("pytorch_lightning").__version__  # type: ignore[attr-defined]


class StandaloneLightning(importlib.abc.MetaPathFinder):
    """The finder of the ``pytorch_lightning`` run (see the module's docstring)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "lightning":
            return importlib.machinery.ModuleSpec("lightning", _Lightning(), is_package=True)
        aliased = target_of(fullname)
        if aliased is None:
            return None  # lightning's other modules: none (the package this finder made has no path to search)
        module = importlib.import_module(aliased)
        return importlib.machinery.ModuleSpec(fullname, _Existing(module), is_package=hasattr(module, "__path__"))


def install() -> None:
    """Alias the names for the ``pytorch_lightning`` run, if this is one; refuse it once ``lightning`` is loaded."""
    if selected() != "pytorch_lightning" or any(isinstance(f, StandaloneLightning) for f in sys.meta_path):
        return
    loaded = sorted(name for name in sys.modules if name == "lightning" or target_of(name) is not None)
    if loaded:
        raise RuntimeError(
            f"{ENVIRONMENT}=pytorch_lightning, but {', '.join(loaded)} were imported before the aliases: "
            "import lightning_scenarios first"
        )
    sys.meta_path.insert(0, StandaloneLightning())
    for prefix, target in ALIASES[:2]:
        logging.Logger.manager.loggerDict[prefix] = logging.getLogger(target)
