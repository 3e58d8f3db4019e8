"""TOGGLE-003 broken: ``toggle_model(sync_grad=False)`` suppresses the sync of the first prepared module only.

Lightning's ``LightningOptimizer.toggle_model`` blocks sync through ``strategy.block_backward_sync()``, that is
``strategy.model.no_sync()``, the one model the strategy wraps. With several modules prepared by one context,
the backward-then-step form all-reduces every module after the first on every micro-step; the closure form
(the context's own ``no_sync``) stays right.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.parallel import no_sync
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import DDP, Mutant

MUTANT = Mutant("TOGGLE-003", ["test_toggle_model_suppresses_sync_of_every_module"], cells=DDP)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def toggle_model(self, sync_grad: bool = True) -> AbstractContextManager[None]:
        context = self.training_context
        context.parts.refusals.check_flag("sync_grad", sync_grad)
        toggle = context.parts.toggling.region(context, self.window_index, sync_grad=True)
        return toggle if sync_grad else _without_sync(toggle, context.parts.parallel.modules[:1])


@contextmanager
def _without_sync(toggle: AbstractContextManager[None], modules: list[torch.nn.Module]) -> Iterator[None]:
    with toggle, no_sync(modules):
        yield


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
