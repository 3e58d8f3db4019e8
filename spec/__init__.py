"""The optimizer-wrapper contract: typed protocols, shared records and the requirement ids.

The rules are stated in the docstrings of :class:`OptimizerWrapper` and :class:`TrainingContext`, each under a
stable id in brackets (:data:`REQUIREMENTS`). A rule that refuses something fixes the exception's type; the
message is the implementation's own, except where the rule says what it names (ERR-003, ERR-006). Paragraphs
marked "Rationale" say why a rule reads as it does and are not normative; ``docs/decisions.md`` in the
repository records each reading the contract has decided.
"""

import importlib.metadata as _metadata

from lightning_optimizer.spec.context import BackwardHook, HookHandle, OptimizerStepHook, StepHook, TrainingContext
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
    FAILURE_POLICIES,
    FEATURES,
    PRECISIONS,
    STRATEGIES,
    DeviceKind,
    FailurePolicy,
    Feature,
    Precision,
    StepOutcome,
    Strategy,
)
from lightning_optimizer.spec.wrapper import OptimizerWrapper

__all__ = [
    "CONTRACT_VERSION",
    "DEVICE_KINDS",
    "FAILURE_POLICIES",
    "FEATURES",
    "PRECISIONS",
    "REQUIREMENTS",
    "STRATEGIES",
    "BackwardHook",
    "Cell",
    "ContextFactory",
    "DeviceKind",
    "FailurePolicy",
    "Feature",
    "GradScalerSettings",
    "HookHandle",
    "ImplementationInfo",
    "OptimizerStepHook",
    "OptimizerWrapper",
    "Precision",
    "StepHook",
    "StepOutcome",
    "Strategy",
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
