"""ZERO-002 broken: Accelerate-style ``zero_grad`` that always clears, wiping an open accumulation window.

The ``zero_grad(); backward(); step()`` loop then steps on the last micro-batch alone.
"""

from __future__ import annotations

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _zero_grad(self, index: int, set_to_none: bool) -> None:
        self._slots[index].optimizer.zero_grad(set_to_none=set_to_none)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
