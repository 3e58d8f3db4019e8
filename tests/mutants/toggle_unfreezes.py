"""TOGGLE-002 broken: untoggling sets every other parameter back to ``requires_grad=True``.

It does not remember which flags it switched, so a parameter the user froze comes back trainable.
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
        others = [p for i, slot in enumerate(self._slots) if i != index for p in slot.params() if id(p) not in own]
        for param in others:
            param.requires_grad_(False)
        try:
            yield
        finally:
            for param in others:
                param.requires_grad_(True)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
