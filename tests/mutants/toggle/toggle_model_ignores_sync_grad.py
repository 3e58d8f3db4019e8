"""TOGGLE-003 broken: ``toggle_model(sync_grad=False)`` toggles ``requires_grad`` but never suppresses DDP sync.

The closure form still runs under ``no_sync()``; the backward-then-step form, which relies on ``sync_grad``,
all-reduces on every micro-step.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import DDP, Mutant

MUTANT = Mutant("TOGGLE-003", ["test_backward_then_step_syncs_through_toggle_model"], cells=DDP)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        context = self.training_context
        context.parts.refusals.check_flag("sync_grad", sync_grad)
        return context.parts.toggling.region(context, self.window_index, sync_grad=True)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
