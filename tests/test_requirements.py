"""The requirement ids of the spec and the conformance checks that verify them."""

from __future__ import annotations

import ast
from pathlib import Path

from lightning_optimizer.spec import REQUIREMENTS

SUITE = Path(__file__).resolve().parents[1] / "conformance"

# Requirements that no check verifies yet; this set only shrinks.
NOT_YET_CHECKED: set[str] = set()


def _checks() -> dict[str, list[str]]:
    """Every check function of the suite, with the requirement ids its marker names."""
    found: dict[str, list[str]] = {}
    for path in sorted(SUITE.glob("test_*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
                ids: list[str] = []
                for decorator in node.decorator_list:
                    if (
                        isinstance(decorator, ast.Call)
                        and isinstance(decorator.func, ast.Attribute)
                        and decorator.func.attr == "requirement"
                    ):
                        ids += [
                            arg.value
                            for arg in decorator.args
                            if isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                        ]
                found[f"{path.name}::{node.name}"] = ids
    return found


def test_requirement_ids_are_well_formed() -> None:
    assert len(REQUIREMENTS) >= 40
    for rule_id, text in REQUIREMENTS.items():
        assert rule_id.split("-")[0].isupper() and len(rule_id.split("-")[1]) == 3, rule_id
        assert len(text) > 20, f"{rule_id} has no normative text: {text!r}"


def test_every_check_names_known_requirements() -> None:
    checks = _checks()
    assert len(checks) >= 30
    for check, ids in checks.items():
        assert ids, f"{check} names no requirement id"
        unknown = set(ids) - set(REQUIREMENTS)
        assert not unknown, f"{check} names unknown requirement ids {sorted(unknown)}"


def test_every_requirement_is_checked() -> None:
    referenced = {rule_id for ids in _checks().values() for rule_id in ids}
    unchecked = set(REQUIREMENTS) - referenced - NOT_YET_CHECKED
    assert not unchecked, f"requirements no conformance check verifies: {sorted(unchecked)}"
    stale = NOT_YET_CHECKED & referenced
    assert not stale, f"checked now, remove from NOT_YET_CHECKED: {sorted(stale)}"
    assert set(REQUIREMENTS) >= NOT_YET_CHECKED, sorted(NOT_YET_CHECKED - set(REQUIREMENTS))
