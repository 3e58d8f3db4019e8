"""The requirement ids of the contract, read from the normative docstrings where they are stated."""

from __future__ import annotations

import inspect
import re
from collections.abc import Iterator, Mapping
from types import MappingProxyType

from lightning_optimizer.spec import context, wrapper

__all__ = ["REQUIREMENTS", "requirement_group"]

# A rule is stated where its id opens a line; an id elsewhere in a docstring only refers to it.
_RULE = re.compile(
    r"^[ \t]*\[([A-Z]+-\d{3})\][ \t]+(\S.*?)(?=\n[ \t]*\n|\n[ \t]*\[[A-Z]+-\d{3}\][ \t]|\Z)",
    re.DOTALL | re.MULTILINE,
)


def _docstrings() -> Iterator[str]:
    for protocol in (wrapper.OptimizerWrapper, context.TrainingContext):
        yield inspect.getdoc(protocol) or ""
        for name, member in vars(protocol).items():
            if not name.startswith("_"):
                target = member.fget if isinstance(member, property) else member
                yield inspect.getdoc(target) or ""


def _collect() -> dict[str, str]:
    found: dict[str, str] = {}
    for doc in _docstrings():
        for rule_id, text in _RULE.findall(doc):
            text = " ".join(text.split())
            if rule_id in found and text != found[rule_id]:
                raise RuntimeError(f"requirement {rule_id} is stated twice with different text")
            found[rule_id] = text
    return dict(sorted(found.items()))


REQUIREMENTS: Mapping[str, str] = MappingProxyType(_collect())
"""Every requirement id of the contract, mapped to its normative text."""


def requirement_group(rule_id: str) -> str:
    """The group a requirement belongs to: ``"STEP"`` for ``"STEP-003"``."""
    return rule_id.rsplit("-", 1)[0]
