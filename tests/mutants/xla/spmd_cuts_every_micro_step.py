"""XLA-002 broken: under SPMD every micro-step cuts the graph, so a window executes as several graphs.

As a loop that calls ``torch_xla.sync()`` after each backward: the results hold, each micro-step compiles and
executes on its own.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA_SPMD, Mutant

MUTANT = Mutant("XLA-002", ["test_spmd_window_is_one_graph", "test_spmd_toggle_model_form"], cells=XLA_SPMD)


class CutsEveryMicroStep(Accumulation):
    def __init__(self, every: object, *, xla: bool) -> None:
        super().__init__(every)
        self.xla = xla

    @override
    def accumulated(self, window: Window) -> None:
        super().accumulated(window)
        if self.xla:
            import torch_xla

            torch_xla.sync()


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = CutsEveryMicroStep(
            self.parts.accumulation.accumulate_grad_batches, xla=self.device.type == "xla"
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
