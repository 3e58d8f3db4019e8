"""TOGGLE-002 broken: when a closure raises, only the next optimizer's parameters get their flags back.

The restore on the error path walks one neighbour instead of every other optimizer: right for two optimizers,
but with three a raising closure leaves the third optimizer's parameters frozen for the rest of training.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.toggling import Toggling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FAULT_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("TOGGLE-002", [FAULT_PROPERTY])


class RestoresOneNeighbour(Toggling):
    @override
    @contextmanager
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> Iterator[None]:
        windows = context.windows
        own = {id(param) for param in windows[index].params()}
        others = [param for i, window in enumerate(windows) if i != index for param in window.params()]
        switched = [param for param in others if id(param) not in own and param.requires_grad]
        for param in switched:
            param.requires_grad_(False)
        following = {id(param) for param in windows[(index + 1) % len(windows)].params()}
        try:
            with nullcontext() if sync_grad else context.parts.parallel.without_sync():
                yield
        except BaseException:
            for param in switched:
                if id(param) in following:
                    param.requires_grad_(True)
            raise
        for param in switched:
            param.requires_grad_(True)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = RestoresOneNeighbour()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
