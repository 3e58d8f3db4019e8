"""The reference, whose factory calls ``pytest.skip``: a skip that does not say whether it is n/a or unavailable."""

from __future__ import annotations

from typing import Any

import pytest

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.suite_info import conformance_info as reference_info
from lightning_optimizer.spec import Cell, ImplementationInfo


def _factory(cell: Cell, **kwargs: Any) -> TrainingContext:
    pytest.skip("this implementation would rather not")


def conformance_info() -> ImplementationInfo[Any]:
    info: ImplementationInfo[Any] = reference_info()
    return ImplementationInfo(
        name="skips itself", version="0", contract_version=info.contract_version, factory=_factory
    )
