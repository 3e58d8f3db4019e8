"""XLA-002 broken: under SPMD the gradients are divided by the device count, as if each device were a replica.

As a loop that averages the gradients over ``global_runtime_device_count()`` after XLA has already reduced them
inside the graph: each step applies half the window's mean on two devices.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.reference.preparation import PreparationStep, Reduction
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import XLA_SPMD, Mutant

MUTANT = Mutant("XLA-002", ["test_spmd_window_is_one_graph"], cells=XLA_SPMD)


class ReductionOverDevices(Reduction):
    @override
    def __call__(self, context: TrainingContext, window: Window) -> None:
        super().__call__(context, window)
        if context.device.type != "xla":
            return
        import importlib

        xr: Any = importlib.import_module("torch_xla.runtime")  # torch_xla leaves is_spmd unannotated
        if xr.is_spmd():
            with torch.no_grad():
                for param in window.params():
                    if param.grad is not None:
                        param.grad = param.grad / xr.global_runtime_device_count()


def _over_devices(step: PreparationStep) -> PreparationStep:
    return ReductionOverDevices() if isinstance(step, Reduction) else step


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        preparation = self.parts.preparation
        self.parts.preparation = dataclasses.replace(
            preparation,
            steps=tuple(map(_over_devices, preparation.steps)),
            evaluation=tuple(map(_over_devices, preparation.evaluation)),
        )


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
