"""XLA-002 broken: under SPMD every micro-step cuts the graph, so a window executes as several graphs.

As a loop that calls ``torch_xla.sync()`` after each backward: the results hold, each micro-step compiles and
executes on its own.
"""

from __future__ import annotations

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _finish_accumulation(self, slot: Window) -> None:
        super()._finish_accumulation(slot)
        if self.device.type == "xla":
            import torch_xla

            torch_xla.sync()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
