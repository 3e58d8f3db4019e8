"""FSDP-002 broken: micro-steps of sharded modules keep gradient sync on; every micro-step reduce-scatters.

As a framework that suppresses DDP's sync (``no_sync()``) and never calls FSDP2's
``set_requires_gradient_sync(False)``: the results hold, at ``accumulate_grad_batches`` times the communication.
"""

from __future__ import annotations

from contextlib import AbstractContextManager

from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _toggle(self, index: int, *, sync_grad: bool) -> AbstractContextManager[None]:
        return super()._toggle(index, sync_grad=sync_grad or bool(self._units))


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
