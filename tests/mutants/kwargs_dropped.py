"""STEP-005 broken: keyword arguments of ``step`` never reach the inner optimizer's ``step``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        super()._inner_step(index, closure, {})


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
