"""An ``--impl`` module whose ``conformance_info()`` returns a dict instead of an ``ImplementationInfo``."""

from __future__ import annotations

from typing import Any


def conformance_info() -> dict[str, Any]:
    return {"name": "a dict", "version": "0", "contract_version": "2026.11"}
