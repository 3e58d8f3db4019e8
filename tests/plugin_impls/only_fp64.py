"""The reference, claiming only ``64-true``."""

from __future__ import annotations

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.suite_info import context_for
from lightning_optimizer.spec import CONTRACT_VERSION, ImplementationInfo


def conformance_info() -> ImplementationInfo[TrainingContext]:
    return ImplementationInfo(
        name="fp64 only",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=context_for,
        precisions=frozenset({"64-true"}),
    )


info = conformance_info
"""The same record under another attribute name (``--impl=plugin_impls.only_fp64:info``)."""
