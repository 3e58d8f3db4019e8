"""The reference, declaring a deviation whose entry is malformed (an unclosed bracket)."""

from __future__ import annotations

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.suite_info import context_for
from lightning_optimizer.spec import CONTRACT_VERSION, ImplementationInfo

ENTRY = "test_wrapper_surface[cpu-32-true"


def conformance_info() -> ImplementationInfo[TrainingContext]:
    return ImplementationInfo(
        name="malformed declaration",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=context_for,
        expected_failures={ENTRY: "an entry with an unclosed bracket"},
    )
