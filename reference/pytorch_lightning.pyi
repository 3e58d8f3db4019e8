"""The types of ``lightning_optimizer.reference.pytorch_lightning``, for mypy.

The package is built at import time from the source files of ``lightning_optimizer.reference.lightning`` (see
:mod:`lightning_optimizer.reference.twin_loader`), where mypy cannot follow it. Its public surface, written against
``pytorch_lightning``: each class with its constructor and the public members the reference adds;
``tests/test_lightning_namespaces.py`` checks these against the built package.
"""

from typing import Any

import torch
from pytorch_lightning.accelerators import XLAAccelerator
from pytorch_lightning.plugins.precision import Precision
from pytorch_lightning.strategies import DDPStrategy, ModelParallelStrategy, SingleDeviceStrategy
from pytorch_lightning.strategies.single_xla import SingleDeviceXLAStrategy

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.module_optimizers import wrapped_optimizers as wrapped_optimizers
from lightning_optimizer.spec.implementation import GradScalerSettings
from lightning_optimizer.spec.types import Precision as PrecisionName

__all__ = [
    "STRATEGY_NAMES",
    "ReferenceDDPStrategy",
    "ReferenceFSDPStrategy",
    "ReferencePrecision",
    "ReferenceSingleDeviceStrategy",
    "ReferenceXLAAccelerator",
    "ReferenceXLAStrategy",
    "wrapped_optimizers",
]

STRATEGY_NAMES: tuple[str, ...]

class ReferencePrecision(Precision):
    context: TrainingContext | None
    def __init__(self) -> None: ...
    def configure(self, precision: PrecisionName) -> None: ...
    def attach(self, context: TrainingContext | None, rank: int = 0, world_size: int = 1) -> None: ...
    def restore_loaded_state(self) -> None: ...

class ReferenceSingleDeviceStrategy(SingleDeviceStrategy):
    def __init__(
        self, device: torch.device | str | int | None = None, *, grad_scaler: GradScalerSettings | None = None
    ) -> None: ...
    @property
    def reference_context(self) -> TrainingContext | None: ...
    @classmethod
    def check_device(cls, device: torch.device) -> None: ...

class ReferenceDDPStrategy(DDPStrategy):
    def __init__(self, *, grad_scaler: GradScalerSettings | None = None, **kwargs: Any) -> None: ...
    @property
    def reference_context(self) -> TrainingContext | None: ...
    @classmethod
    def check_device(cls, device: torch.device) -> None: ...

class ReferenceFSDPStrategy(ModelParallelStrategy):
    def __init__(
        self,
        *,
        grad_scaler: GradScalerSettings | None = None,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        **kwargs: Any,
    ) -> None: ...
    @property
    def reference_context(self) -> TrainingContext | None: ...
    @classmethod
    def check_device(cls, device: torch.device) -> None: ...

class ReferenceXLAAccelerator(XLAAccelerator): ...

class ReferenceXLAStrategy(SingleDeviceXLAStrategy):
    def __init__(
        self, device: int = 0, *, grad_scaler: GradScalerSettings | None = None, debug: bool = False
    ) -> None: ...
    @property
    def reference_context(self) -> TrainingContext | None: ...
    @classmethod
    def check_device(cls, device: torch.device) -> None: ...
