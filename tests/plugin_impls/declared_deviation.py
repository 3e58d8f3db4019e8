"""The reference, declaring as a deviation a check that it passes (the strict xfail must catch that)."""

from __future__ import annotations

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.suite_info import context_for
from lightning_optimizer.spec import CONTRACT_VERSION, ImplementationInfo

CELL_CHECK = "test_wrapper_surface[cpu-32-true-ws1]"


def conformance_info() -> ImplementationInfo[TrainingContext]:
    return ImplementationInfo(
        name="needless deviation",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=context_for,
        expected_failures={CELL_CHECK: "thought the wrapper lacked a member"},
    )
