"""STEP-006 broken: ``step`` returns ``None`` (like a bare ``Optimizer.step()``), not the closure's result."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        super()._step(index, closure, make_optimizer_step, kwargs)
        return None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
