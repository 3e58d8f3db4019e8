"""TOGGLE-002 broken: untoggling sets every other parameter back to ``requires_grad=True``.

It does not remember which flags it switched, so a parameter the user froze comes back trainable.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.toggling import Toggling
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant(
    "TOGGLE-002",
    ["test_closure_sees_only_its_parameters", "test_toggle_model_block", "test_raising_closure_restores_flags"],
)


class Unfreezes(Toggling):
    @override
    @contextmanager
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> Iterator[None]:
        windows = context.windows.all
        own = {id(param) for param in windows[index].params()}
        others = [p for i, window in enumerate(windows) if i != index for p in window.params() if id(p) not in own]
        for param in others:
            param.requires_grad_(False)
        try:
            with nullcontext() if sync_grad else context.parts.parallel.without_sync():
                yield
        finally:
            for param in others:
                param.requires_grad_(True)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = Unfreezes()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
