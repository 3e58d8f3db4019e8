"""ZERO-002 broken: ``zero_grad(set_to_none=False)`` zeroes an open window; only the default keeps it.

The guard was written for the default call (``if set_to_none and window_open: return``), so the older spelling
``zero_grad(set_to_none=False)`` (Lightning's and many user loops') falls through to the inner optimizer and wipes
the accumulated gradients.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _zero_grad(self, index: int, set_to_none: bool) -> None:
        if set_to_none:
            super()._zero_grad(index, set_to_none)
        else:
            self._slots[index].optimizer.zero_grad(set_to_none=False)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
