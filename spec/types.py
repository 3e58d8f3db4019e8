"""Names and records that the contract, the reference and the conformance suite share."""

from __future__ import annotations

import enum
from typing import Final, Literal, get_args

CONTRACT_VERSION: Final = "2026.12.11"
"""Version of the contract stated by this package; implementations declare the one they follow."""

Precision = Literal["64-true", "32-true", "16-mixed", "bf16-mixed", "bf16-true", "16-true"]
"""Precision names, spelled as Lightning spells them."""

DeviceKind = Literal["cpu", "cuda", "xla"]
"""Kinds of device an implementation can run on."""

Strategy = Literal["none", "ddp", "fsdp", "spmd"]
"""How the ranks of a cell share the model: one process (``none``), replicated with DDP (``ddp``), sharded with
FSDP2's ``fully_shard`` (``fsdp``), or, on XLA, one process driving several devices under SPMD (``spmd``, XLA-002)."""

Feature = Literal[
    "closure_evaluating_optimizers",
    "checkpointing",
    "pickling",
    "lr_schedulers",
    "hooks",
    "exact_restore",
    "user_zero_grad",
]
"""Optional capabilities an implementation may claim; checks that need one are ``n/a`` without it.

``exact_restore``: the context takes ``on_failure="restore"`` (FAIL-004). ``user_zero_grad``: the context takes
``zero_grad_after_step=False`` (ZERO-003), leaving the gradients of a real step to the user's ``zero_grad()``."""

FailurePolicy = Literal["discard", "restore"]
"""What a failed ``step()`` leaves of its window (FAIL-001): discarded (the default), or restored exactly."""

PRECISIONS: Final[tuple[Precision, ...]] = get_args(Precision)
DEVICE_KINDS: Final[tuple[DeviceKind, ...]] = get_args(DeviceKind)
STRATEGIES: Final[tuple[Strategy, ...]] = get_args(Strategy)
FEATURES: Final[tuple[Feature, ...]] = get_args(Feature)
FAILURE_POLICIES: Final[tuple[FailurePolicy, ...]] = get_args(FailurePolicy)


class StepOutcome(enum.Enum):
    """What one ``step()`` call did. [STEP-004]"""

    STEPPED = "stepped"
    """The inner optimizer stepped and the window closed."""
    ACCUMULATED = "accumulated"
    """The closure ran and gradients accumulated; nothing else changed."""
    SKIPPED_NON_FINITE = "skipped-non-finite"
    """The window closed, but the gradients were not finite: parameters and optimizer state are untouched."""
    DISCARDED = "discarded"
    """The call failed after a backward wrote into its window, which was discarded (``on_failure="discard"``,
    FAIL-003); the exception propagated."""
