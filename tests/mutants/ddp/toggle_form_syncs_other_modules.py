"""DDP-001 broken: ``toggle_model(sync_grad=True)`` leaves the other DDP modules under sync in a closing micro-step.

Like a fix of the toggled-out modules' sync made where the step knows it closes its window (the closure path) but
not in ``toggle_model()``, which, like Lightning's ``toggle_model(sync_grad=True)``, enters nothing: in the
backward-then-step form a GAN's discriminator forward arms DDP's reducer, and its next micro-step that does not
close a window all-reduces inside ``no_sync()``. Results stay right; a non-closing micro-step costs an all-reduce.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.toggling import Toggling, only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, RANK_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("DDP-001", [RANK_PROPERTY], cells=DDP, blind="batch 2")


class ClosurePathOnly(Toggling):
    @override
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        windows = context.windows
        if sync_grad and windows.call is None:  # toggle_model(sync_grad=True): toggling only
            others = [param for i, window in enumerate(windows) if i != index for param in window.params()]
            return only_these_require_grad(windows[index].params(), others)
        return super().region(context, index, sync_grad=sync_grad)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = ClosurePathOnly()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
