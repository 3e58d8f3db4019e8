"""Why a check does not run here, as exception types: the plugin classifies a skip by its type, not its text.

A check (or the plugin, at collection) that does not run in a cell raises one of these instead of calling
``pytest.skip``: :class:`NotApplicable` when the check does not apply there or the implementation does not claim
what it needs (``n/a`` in the matrix), :class:`Unavailable` when it is claimed but this machine cannot run it (no
GPU, no torch_xla, no hypothesis). A plain ``pytest.skip`` in a check is reported as an error: a skip must say
which of the two it is. (Both derive from ``pytest.skip.Exception``, which pytest's public API names only as
that attribute; the class itself is ``_pytest.outcomes.Skipped``, checked by ``tests/test_plugin.py``.)
"""

from __future__ import annotations

from typing import NoReturn

from _pytest.outcomes import Skipped

__all__ = ["NotApplicable", "Unavailable", "not_applicable", "unavailable"]


class NotApplicable(Skipped):
    """The check does not apply to this cell, or the implementation does not claim what it needs."""


class Unavailable(Skipped):
    """The implementation claims the cell, but this machine cannot run it."""


def not_applicable(reason: str) -> NoReturn:
    """Stop the check as ``n/a``, saying why."""
    raise NotApplicable(reason)


def unavailable(reason: str) -> NoReturn:
    """Stop the check as ``unavailable``, saying what this machine lacks."""
    raise Unavailable(reason)
