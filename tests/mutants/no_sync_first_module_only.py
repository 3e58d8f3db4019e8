"""DDP-001 broken: micro-steps that do not close a window suppress the sync of the first prepared module only.

Like a strategy that keeps one ``self.model`` and enters ``self.model.no_sync()`` (Lightning's
``block_backward_sync``): with several modules prepared by one context, every module after the first
all-reduces on every micro-step, in the closure form and under ``toggle_model(sync_grad=False)`` alike.
Results stay right; the communication is not one all-reduce per window.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager

import torch

from lightning_optimizer.reference.distributed import no_sync
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _toggle(self, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        toggle = super()._toggle(index, sync_grad=True)
        return toggle if sync_grad else _without_sync(toggle, self._modules[:1])


@contextmanager
def _without_sync(toggle: AbstractContextManager[None], modules: list[torch.nn.Module]) -> Iterator[None]:
    with toggle, no_sync(modules):
        yield


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
