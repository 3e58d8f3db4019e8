"""ZERO-002 broken: ``zero_grad()`` clears an open window whose optimizer's (sharded) parameters hold no gradient.

Like a shortcut "an open window that holds no gradient has nothing to keep", read from ``param.grad``: harmless
under DDP, where every micro-step leaves its sum there, but under FSDP the micro-steps without sync leave their sums
on the unsharded parameters and the shards hold nothing, so ``zero_grad()`` in the ``zero_grad(); step(closure)``
loop clears the window and drops those sums; the real step then applies only the closing micro-step's part.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import FSDP, RANK_PROPERTY, Mutant

MUTANT = Mutant("ZERO-002", [RANK_PROPERTY], cells=FSDP, blind="batch 2")


class EmptyWindowClears(Accumulation):
    @override
    def zero_grad_clears(self, window: Window) -> bool:
        return window.length == 0 or not window.has_gradients()


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = EmptyWindowClears(self.parts.accumulation.accumulate_grad_batches)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
