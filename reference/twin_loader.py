"""The Lightning strategies for ``pytorch_lightning``, built at import time from the reference's Lightning package.

``lightning_optimizer.reference.pytorch_lightning`` is made from the source files of
``lightning_optimizer.reference.lightning``.

Lightning ships its Trainer under two names: ``lightning.pytorch`` (with ``lightning.fabric``), in the ``lightning``
distribution that Lightning's documentation installs (``import lightning as L``), and ``pytorch_lightning`` (with
``lightning_fabric``), the standalone ``pytorch-lightning`` distribution, whose sources Lightning's own build derives
from the first by rewriting the imports. Their classes are distinct: a ``pytorch_lightning.Trainer`` refuses a
strategy that subclasses ``lightning.pytorch``'s ``Strategy``, and the other way round. So the strategies exist twice,
from one source: the package ``reference/lightning/`` is written against ``lightning.pytorch`` and
``lightning.fabric``, and its twin is that package with three rewrites per source file, made by :class:`TwinLoader`
as each module is imported (see :data:`REWRITES`). The rewrites keep every line where it is, and each module's code
is compiled with its source file's path, so tracebacks and ``inspect`` point at the real source lines. Nothing is
written to disk.

This module imports no Lightning. ``reference/pytorch_lightning.py`` calls :func:`load_twin` when the twin is first
imported; :func:`missing_lightning` is the error either package raises where its Lightning is not installed.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import re
import sys
from dataclasses import dataclass
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType
from typing import Final

__all__ = [
    "NAMESPACES",
    "REWRITES",
    "SOURCE_PACKAGE",
    "TWIN_PACKAGE",
    "Namespace",
    "TwinFinder",
    "TwinLoader",
    "load_twin",
    "missing_lightning",
    "rewrite",
    "source_file",
]

SOURCE_PACKAGE: Final = "lightning_optimizer.reference.lightning"
"""The package written against ``lightning.pytorch``: ``reference/lightning/``."""
TWIN_PACKAGE: Final = "lightning_optimizer.reference.pytorch_lightning"
"""Its twin for ``pytorch_lightning``, built from the same files."""
SOURCE_DIR: Final = Path(__file__).resolve().parent / "lightning"

REWRITES: Final = (
    (re.compile(r"\blightning_optimizer\.reference\.lightning\b"), TWIN_PACKAGE),
    (re.compile(r"(?<![\w.])lightning\.pytorch\b"), "pytorch_lightning"),
    (re.compile(r"(?<![\w.])lightning\.fabric\b"), "lightning_fabric"),
)
"""What the twin's source is: the package's own name, ``lightning.pytorch`` and ``lightning.fabric`` replaced, as
Lightning's build derives ``pytorch_lightning`` and ``lightning_fabric``. The sources import Lightning only in these
forms (``tests/test_lightning_namespaces.py`` checks that no other import of ``lightning`` is left in the twin)."""


def rewrite(source: str) -> str:
    """A source file of :data:`SOURCE_PACKAGE` as the twin runs it (each line stays where it is)."""
    for pattern, replacement in REWRITES:
        source = pattern.sub(replacement, source)
    return source


def source_file(name: str) -> Path | None:
    """The source file of the twin's module ``name`` (``__init__.py`` for a package), ``None`` if there is none."""
    if name != TWIN_PACKAGE and not name.startswith(TWIN_PACKAGE + "."):
        return None
    relative = name[len(TWIN_PACKAGE) :].lstrip(".")
    base = SOURCE_DIR.joinpath(*relative.split(".")) if relative else SOURCE_DIR
    for candidate in (base / "__init__.py", base.with_suffix(".py")):
        if candidate.is_file():
            return candidate
    return None


class TwinLoader(importlib.abc.SourceLoader):
    """Loads one module of the twin: its source file, rewritten (:func:`rewrite`), compiled with the file's path.

    No bytecode is cached: the file's own cache holds the ``lightning.pytorch`` module's code.
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def get_filename(self, fullname: str) -> str:
        """The real source file, so that tracebacks show its lines."""
        return str(self.path)

    def get_data(self, path: str) -> bytes:
        """The rewritten source."""
        return rewrite(Path(path).read_text(encoding="utf-8")).encode("utf-8")


class TwinFinder(importlib.abc.MetaPathFinder):
    """Finds the modules of :data:`TWIN_PACKAGE` (the package, and each module below it) and only those."""

    def find_spec(self, fullname: str, path: object = None, target: ModuleType | None = None) -> ModuleSpec | None:
        """The twin module's spec: its source file, loaded by :class:`TwinLoader`."""
        source = source_file(fullname)
        if source is None:
            return None
        is_package = source.name == "__init__.py"
        return importlib.util.spec_from_file_location(
            fullname, source, loader=TwinLoader(source), submodule_search_locations=[] if is_package else None
        )


_FINDER: Final = TwinFinder()


def load_twin() -> ModuleType:
    """Build :data:`TWIN_PACKAGE` (its modules below it are found by :class:`TwinFinder` as they are imported).

    Called by ``reference/pytorch_lightning.py`` while Python imports the twin by that name; the module returned
    takes that file's place in ``sys.modules``.
    """
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    spec = _FINDER.find_spec(TWIN_PACKAGE)
    assert spec is not None and spec.loader is not None, f"{SOURCE_DIR} has no __init__.py"
    module = importlib.util.module_from_spec(spec)
    sys.modules[TWIN_PACKAGE] = module
    spec.loader.exec_module(module)
    return module


@dataclass(frozen=True)
class Namespace:
    """One of Lightning's two names for its Trainer, and the package of the reference's strategies for it."""

    package: str
    """The reference's package for this namespace."""
    trainer: str
    """Where its ``Trainer`` is: ``lightning.pytorch`` or ``pytorch_lightning``."""
    modules: tuple[str, ...]
    """The top-level modules it imports: a missing one means this Lightning is not installed."""
    distribution: str
    """The distribution that brings it."""
    extra: str
    """The extra of ``lightning-optimizer`` that installs it."""


NAMESPACES: Final = {
    SOURCE_PACKAGE: Namespace(SOURCE_PACKAGE, "lightning.pytorch", ("lightning",), "lightning", "lightning"),
    TWIN_PACKAGE: Namespace(
        TWIN_PACKAGE,
        "pytorch_lightning",
        ("pytorch_lightning", "lightning_fabric"),
        "pytorch-lightning",
        "pytorch-lightning",
    ),
}


def missing_lightning(package: str, error: ModuleNotFoundError) -> ModuleNotFoundError:
    """The error ``package`` raises when its Lightning is missing: what to install, and the other package.

    ``error`` itself when what is missing is not that Lightning.
    """
    namespace = NAMESPACES[package]
    if (error.name or "").split(".")[0] not in namespace.modules:
        return error
    (other,) = (other for other in NAMESPACES.values() if other is not namespace)
    return ModuleNotFoundError(
        f"{package} needs the {namespace.distribution} distribution ({error}): "
        f"pip install 'lightning-optimizer[{namespace.extra}]'. For {other.trainer}.Trainer use {other.package}",
        name=error.name,
    )
