"""TOGGLE-002 broken: toggled ``requires_grad`` flags are restored after the block, but not when it raises.

The restore is written after the ``yield`` instead of in a ``finally``.
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


MUTANT = Mutant("TOGGLE-002", ["test_raising_closure_restores_flags", "test_toggle_model_block", FAULT_PROPERTY])


class NotRestoredOnRaise(Toggling):
    @override
    @contextmanager
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> Iterator[None]:
        windows = context.windows.all
        own = {id(param) for param in windows[index].params()}
        others = [param for i, window in enumerate(windows) if i != index for param in window.params()]
        switched = [param for param in others if id(param) not in own and param.requires_grad]
        for param in switched:
            param.requires_grad_(False)
        with nullcontext() if sync_grad else context.parts.parallel.without_sync():
            yield
        for param in switched:
            param.requires_grad_(True)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = NotRestoredOnRaise()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
