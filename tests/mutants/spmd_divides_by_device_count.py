"""XLA-002 broken: under SPMD the gradients are divided by the device count, as if each device were a replica.

As a loop that averages the gradients over ``global_runtime_device_count()`` after XLA has already reduced them
inside the graph: each step applies half the window's mean on two devices.
"""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class Context(MutantContext):
    def _reduce_gradients(self, slot: Window) -> None:
        super()._reduce_gradients(slot)
        if self.device.type != "xla":
            return
        import importlib

        xr: Any = importlib.import_module("torch_xla.runtime")  # torch_xla leaves is_spmd unannotated
        if xr.is_spmd():
            with torch.no_grad():
                for param in slot.params():
                    if param.grad is not None:
                        param.grad = param.grad / xr.global_runtime_device_count()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
