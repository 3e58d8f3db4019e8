"""No private name of the reference is read outside the module that defines it.

The reference's seam is public: the context's ``windows`` owner (:mod:`lightning_optimizer.reference.windows`),
its ``parts``, its stages and the wrapper's public members. A test, a broken implementation, the suite, the peers or
another module of the reference that reads ``obj._name`` (or ``getattr(obj, "_name")``, or imports ``_name``) where
``_name`` is defined by a module of ``reference/`` ties itself to that module's internals, and a refactor of them
ripples through it. This walk of the sources fails on every such read; a file may use a private name it defines
itself (a function or class, a name, an attribute of ``self`` or ``cls``: a subclass's own state, the second
implementation's own fields; a store into another object's private attribute defines nothing), and
``torch_compat``/``lightning/compat`` keep the internals of torch and Lightning.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("reference", "conformance", "peers", "tests", "bench", "examples")
FRAMEWORK_INTERNALS = frozenset({"torch_compat.py", "compat.py"})
"""The modules that keep torch's and Lightning's internals: the private names they use are the frameworks', whose
tests (``tests/test_lightning.py``'s compat checks) read them on purpose."""


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _defined(tree: ast.Module) -> set[str]:
    """The private names a module defines: functions, classes, names it assigns, attributes it assigns on ``self`` or
    ``cls``, and ``__slots__`` entries (a store into another object's private attribute defines nothing)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if isinstance(node.value, ast.Name) and node.value.id in {"self", "cls"}:
                names.add(node.attr)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__slots__" for target in node.targets
        ):
            names.update(
                constant.value
                for constant in ast.walk(node.value)
                if isinstance(constant, ast.Constant) and isinstance(constant.value, str)
            )
    return {name for name in names if _private(name)}


def _strings_read(node: ast.AST) -> list[str]:
    """``getattr(obj, "_name")``, ``hasattr``, ``setattr``, ``delattr``: the attribute named by a string."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in {"getattr", "hasattr", "setattr", "delattr"}
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return [node.args[1].value]
    return []


def _sources() -> dict[Path, ast.Module]:
    return {
        path: ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for root in SCANNED
        for path in sorted((ROOT / root).rglob("*.py"))
    }


def _reach_ins() -> list[str]:
    sources = _sources()
    owners: dict[str, set[Path]] = defaultdict(set)
    for path, tree in sources.items():
        if path.is_relative_to(ROOT / "reference") and path.name not in FRAMEWORK_INTERNALS:
            for name in _defined(tree):
                owners[name].add(path)
    found = []
    for path, tree in sources.items():
        own = _defined(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute):
                used = [node.attr]
            elif isinstance(node, ast.Call):
                used = _strings_read(node)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning_optimizer.reference"):
                used = [alias.name for alias in node.names]
            else:
                continue
            for name in used:
                if name in owners and path not in owners[name] and name not in own:
                    where = ", ".join(sorted(str(owner.relative_to(ROOT)) for owner in owners[name]))
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name} (defined in {where})")
    return found


def test_no_private_name_of_the_reference_is_read_outside_its_module() -> None:
    found = _reach_ins()
    assert not found, "private names of the reference read outside their module:\n" + "\n".join(found)


def test_the_walk_finds_a_reach_in(tmp_path: Path) -> None:
    """The walk itself: a read of a private attribute defined elsewhere is found, one defined here is not."""
    owner = ast.parse("class A:\n    def __init__(self):\n        self._state = 1\n")
    reader = ast.parse("def f(a):\n    return a._state\n")
    own = ast.parse(
        "class B:\n    def __init__(self):\n        self._state = 2\n    def g(self, b):\n        return b._state\n"
    )
    assert "_state" in _defined(owner)
    assert "_state" not in _defined(reader)
    assert "_state" in _defined(own)
    assert [n.attr for n in ast.walk(reader) if isinstance(n, ast.Attribute)] == ["_state"]
