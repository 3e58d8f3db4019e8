"""An implementation that claims a precision the contract does not name."""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.suite_info import context_for
from lightning_optimizer.spec import CONTRACT_VERSION, ImplementationInfo


def conformance_info() -> ImplementationInfo[Any]:
    return ImplementationInfo(
        name="claims fp8",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=context_for,
        precisions=frozenset({"32-true", "fp8-true"}),  # type: ignore[arg-type]
    )
