"""ZERO-002 broken: ``zero_grad(set_to_none=False)`` zeroes an open window; only the default keeps it.

The guard was written for the default call (``if set_to_none and window_open: return``), so the older spelling
``zero_grad(set_to_none=False)`` (Lightning's and many user loops') falls through to the inner optimizer and wipes
the accumulated gradients.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import ORACLE_PROPERTY, Mutant

MUTANT = Mutant("ZERO-002", [ORACLE_PROPERTY])


class Wrapper(WrappedOptimizer[Any]):
    @override
    def zero_grad(self, set_to_none: bool = True) -> None:
        if set_to_none:
            super().zero_grad(set_to_none)  # the guarded default call
            return
        # set_to_none=False: the guard (an open window is not cleared) is skipped, the rest is the reference's
        context = self.training_context
        window, call = context.windows[self.window_index], context.windows.call
        context.parts.refusals.check_zero_grad(context, window)
        if call is not None and call.window is window:
            call.transaction.cleared(set_to_none)
        context.parts.zeroing.clear(window, set_to_none)
        window.optimizer.zero_grad(set_to_none=set_to_none)
        context.parts.parallel.clear_unsynced(window)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
