"""TOGGLE-002 broken: untoggling restores the ``requires_grad`` flags recorded when each optimizer was wrapped.

Right while nobody changes a flag; a parameter the user froze after wrap comes back trainable after another
optimizer's closure, and one the user unfroze after wrap comes back frozen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import torch

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.distributed import no_sync
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._flags_at_wrap: dict[int, bool] = {}

    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        for param in self._slots[-1].params():
            self._flags_at_wrap.setdefault(id(param), param.requires_grad)
        return wrapper

    @contextmanager
    def _toggle(self, index: int, *, sync_grad: bool) -> Iterator[None]:
        own = {id(param) for param in self._slots[index].params()}
        others = {
            id(p): p for i, slot in enumerate(self._slots) if i != index for p in slot.params() if id(p) not in own
        }
        restore = {key: self._flags_at_wrap.get(key, param.requires_grad) for key, param in others.items()}
        for param in others.values():
            param.requires_grad_(False)
        try:
            with no_sync(self._modules if not sync_grad else ()):
                yield
        finally:
            for key, param in others.items():
                param.requires_grad_(restore[key])


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
