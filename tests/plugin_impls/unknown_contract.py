"""An implementation that follows a contract version this suite does not know."""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.suite_info import context_for
from lightning_optimizer.spec import ImplementationInfo

VERSION = "1999.01"


def conformance_info() -> ImplementationInfo[Any]:
    return ImplementationInfo(name="old contract", version="0", contract_version=VERSION, factory=context_for)
