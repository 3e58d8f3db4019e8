"""TOGGLE-002 broken: toggled ``requires_grad`` flags are restored after the block, but not when it raises.

The restore is written after the ``yield`` instead of in a ``finally``.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    @contextmanager
    def _toggle(self, index: int, *, sync_grad: bool) -> Iterator[None]:
        own = {id(param) for param in self._slots[index].params()}
        others = [param for i, slot in enumerate(self._slots) if i != index for param in slot.params()]
        switched = [param for param in others if id(param) not in own and param.requires_grad]
        for param in switched:
            param.requires_grad_(False)
        yield
        for param in switched:
            param.requires_grad_(True)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
