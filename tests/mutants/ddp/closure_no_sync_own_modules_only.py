"""DDP-001 broken: a closure that does not close its window suppresses the sync of its own modules only.

Like a step that enters ``no_sync()`` of the DDP modules holding the optimizer's parameters, reasoning that the
toggled-out ones get no gradient anyway: their forwards (a GAN generator's inside the discriminator's closure) run
under sync, arm DDP's reducer, and their own next micro-step all-reduces inside ``no_sync()``. The closing step
and ``toggle_model(sync_grad=False)`` stay right, and so do the results; the communication per window does not.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import TypeVar

from typing_extensions import override

from lightning_optimizer.reference.call import Call
from lightning_optimizer.reference.parallel import no_sync
from lightning_optimizer.reference.toggling import only_these_require_grad
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import DDP, RANK_PROPERTY, Mutant

MUTANT = Mutant("DDP-001", [RANK_PROPERTY], cells=DDP, blind="batch 2")

T = TypeVar("T")


class Context(MutantContext):
    @override
    def run_closure(self, call: Call, index: int, closure: Callable[[], T]) -> T:
        if call.real:
            return super().run_closure(call, index, closure)
        parts, scaling = self.parts, self.parts.scaling
        own = self.windows[index].params()
        others = [p for i, window in enumerate(self.windows) if i != index for p in window.params()]
        ids = {id(param) for param in own}
        trained = [m for m in parts.parallel.modules if any(id(p) in ids for p in m.parameters())]
        watch: AbstractContextManager[None] = (
            scaling.watch(parts.parallel.window_tensors(call.window)) if scaling.changes_gradients else nullcontext()
        )
        with ExitStack() as stack:
            stack.enter_context(only_these_require_grad(own, others))
            stack.enter_context(no_sync(trained, getattr(parts.parallel, "units", ())))
            stack.enter_context(watch)
            stack.enter_context(self.autocast())
            return closure()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
