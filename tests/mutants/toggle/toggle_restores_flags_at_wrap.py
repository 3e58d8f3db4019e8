"""TOGGLE-002 broken: untoggling restores the ``requires_grad`` flags recorded when each optimizer was wrapped.

Right while nobody changes a flag; a parameter the user froze after wrap comes back trainable after another
optimizer's closure, and one the user unfroze after wrap comes back frozen.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, TypeVar

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.toggling import Toggling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import ORACLE_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("TOGGLE-002", ["test_toggling_follows_flags_and_groups_changed_after_wrap", ORACLE_PROPERTY])

OptimizerT = TypeVar("OptimizerT", bound=torch.optim.Optimizer)


class FlagsAtWrap(Toggling):
    def __init__(self) -> None:
        self.flags_at_wrap: dict[int, bool] = {}

    @override
    @contextmanager
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> Iterator[None]:
        windows = context.windows.all
        own = {id(param) for param in windows[index].params()}
        others = {
            id(p): p for i, window in enumerate(windows) if i != index for p in window.params() if id(p) not in own
        }
        restore = {key: self.flags_at_wrap.get(key, param.requires_grad) for key, param in others.items()}
        for param in others.values():
            param.requires_grad_(False)
        try:
            with nullcontext() if sync_grad else context.parts.parallel.without_sync():
                yield
        finally:
            for key, param in others.items():
                param.requires_grad_(restore[key])


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._at_wrap = FlagsAtWrap()
        self.parts.toggling = self._at_wrap

    @override
    def wrap(self, optimizer: OptimizerT) -> WrappedOptimizer[OptimizerT]:
        wrapper = super().wrap(optimizer)
        for param in self.windows[-1].params():
            self._at_wrap.flags_at_wrap.setdefault(id(param), param.requires_grad)
        return wrapper


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
