"""CLOS-003 broken under FSDP: a failed call restores the shards' gradients but not FSDP's unsynced sums.

As an implementation whose window is ``param.grad`` only (it still refuses a step no backward synced): a closure
that raises after its backward leaves that backward's gradient in FSDP's accumulation on the unsharded parameters,
and the retried call adds it again.
"""

from __future__ import annotations

import torch

from lightning_optimizer.reference.fsdp import unsynced_gradients
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _unsynced(self, slot: Window) -> list[torch.Tensor]:
        return []

    def _check_synced(self, slot: Window) -> None:
        if any(tensor.grad is not None for tensor in unsynced_gradients(self._units, slot.params())):
            raise RuntimeError("the window holds gradients that no backward synced")


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
