"""STEP-005 broken: keyword arguments of ``step`` never reach the inner optimizer's ``step``."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("STEP-005", ["test_kwargs_reach_the_inner_step"])


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        return super().inner_step(window, {}, closure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
