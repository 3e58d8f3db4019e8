"""STEP-005 broken: under 16-mixed the real step goes through ``scaler.step(optimizer)`` without ``step``'s kwargs.

The keyword arguments reach the inner step on the path without a loss scaler (and on a 16-mixed step without
gradients, which bypasses the scaler), but the common 16-mixed path, ``scaler.step(inner)``, drops them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant("STEP-005", ["test_kwargs_and_result_with_gradients"], cells=F16)


class Context(MutantContext):
    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        if self.scaler is not None and window.has_gradients():
            kwargs = {}
        return super().inner_step(window, kwargs, closure)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
