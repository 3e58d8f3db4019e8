"""The optimizer-wrapper contract: typed protocols, shared records and the requirement ids."""

from lightning_optimizer.spec.context import TrainingContext
from lightning_optimizer.spec.implementation import Cell, ContextFactory, GradScalerSettings, ImplementationInfo
from lightning_optimizer.spec.requirements import REQUIREMENTS, requirement_group
from lightning_optimizer.spec.types import (
    CONTRACT_VERSION,
    DEVICE_KINDS,
    FEATURES,
    PRECISIONS,
    DeviceKind,
    Feature,
    Precision,
    StepOutcome,
)
from lightning_optimizer.spec.wrapper import OptimizerWrapper

__all__ = [
    "CONTRACT_VERSION",
    "DEVICE_KINDS",
    "FEATURES",
    "PRECISIONS",
    "REQUIREMENTS",
    "Cell",
    "ContextFactory",
    "DeviceKind",
    "Feature",
    "GradScalerSettings",
    "ImplementationInfo",
    "OptimizerWrapper",
    "Precision",
    "StepOutcome",
    "TrainingContext",
    "requirement_group",
]
