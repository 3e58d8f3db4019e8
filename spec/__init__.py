"""The optimizer-wrapper contract: typed protocols, shared records and the requirement ids."""

import importlib.metadata as _metadata

from lightning_optimizer.spec.context import TrainingContext
from lightning_optimizer.spec.implementation import (
    Cell,
    ContextFactory,
    GradScalerSettings,
    ImplementationInfo,
    check_factory,
    implementation_info,
)
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
    "check_factory",
    "implementation_info",
    "requirement_group",
]

try:
    # The one version of the distribution, pyproject.toml's; every package of it re-exports this value.
    __version__: str = _metadata.version("lightning-optimizer")
except _metadata.PackageNotFoundError:  # the sources imported without an install
    __version__ = "0+unknown"
