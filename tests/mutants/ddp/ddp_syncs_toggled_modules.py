"""DDP-001 broken: a micro-step that syncs runs every DDP module's forward under sync, toggled-off ones included.

Like a strategy that enters ``no_sync()`` only on micro-steps that do not close a window. A GAN's generator step
runs the discriminator's forward under sync while toggling keeps it out of the backward: its reducer is left
waiting, and the discriminator's next backward, inside ``no_sync()``, all-reduces. Results stay right; a window
that does not close costs an all-reduce.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.toggling import Toggling, only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, RANK_PROPERTY, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("DDP-001", [RANK_PROPERTY], cells=DDP)


class SyncEveryModule(Toggling):
    @override
    def region(self, context: TrainingContext, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        if not sync_grad:
            return super().region(context, index, sync_grad=False)
        windows = context.windows.all
        others = [param for i, window in enumerate(windows) if i != index for param in window.params()]
        return only_these_require_grad(windows[index].params(), others) if others else nullcontext()


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.toggling = SyncEveryModule()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
