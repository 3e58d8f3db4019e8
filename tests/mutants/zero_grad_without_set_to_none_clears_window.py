"""ZERO-002 broken: ``zero_grad(set_to_none=False)`` zeroes an open window; only the default keeps it.

The guard was written for the default call (``if set_to_none and window_open: return``), so the older spelling
``zero_grad(set_to_none=False)`` (Lightning's and many user loops') falls through to the inner optimizer and wipes
the accumulated gradients.
"""

from __future__ import annotations

from typing import Any

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class GuardsDefaultOnly(Accumulation):
    def zero_grad_clears(self, window: Window, set_to_none: bool) -> bool:
        return not set_to_none or super().zero_grad_clears(window, set_to_none)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = GuardsDefaultOnly(self.parts.accumulation.every)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
