"""TOGGLE-002 broken: when a closure raises, only the next optimizer's parameters get their flags back.

The restore on the error path walks one neighbour instead of every other optimizer: right for two optimizers,
but with three a raising closure leaves the third optimizer's parameters frozen for the rest of training.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from lightning_optimizer.reference.distributed import no_sync
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
        following = {id(param) for param in self._slots[(index + 1) % len(self._slots)].params()}
        try:
            with no_sync(self._modules if not sync_grad else ()):
                yield
        except BaseException:
            for param in switched:
                if id(param) in following:
                    param.requires_grad_(True)
            raise
        for param in switched:
            param.requires_grad_(True)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
