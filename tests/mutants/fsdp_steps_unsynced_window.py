"""FSDP-005 broken: a real step runs although no backward of its window synced.

As a loop whose last backward sat inside ``toggle_model(sync_grad=False)``: the shards' gradients are empty, the
step applies nothing (or only what weight decay and momentum do) and reports a step.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _check_synced(self, slot: Window) -> None:
        return


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
