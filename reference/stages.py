"""The seam of the reference: its collaborators' protocols, and the few stages of a call a variant may replace.

A :class:`~lightning_optimizer.reference.TrainingContext` is composed of collaborators (``context.parts``,
:class:`~lightning_optimizer.reference.context.Parts`), each one object: the precision, loss scaling, the device,
the accumulation rule, the preparation steps, data parallelism, the failure policy, toggling, closures, hooks,
refusals, the checkpoint format, what a real step leaves of its gradients and what changed a window from outside.
A variant of the reference (the project's broken implementations in ``tests/mutants``, a framework's subclass)
replaces a collaborator with another object that keeps its protocol, or overrides one of the :data:`STAGE_NAMES`:
the public stages of a call. It never replaces the call itself (the transaction around the stages), so a failed
call is still left as its failure policy says. ``tests/test_mutants.py`` holds every mutant to this seam.

The protocols are the collaborators' classes themselves, documented where they live:

- :class:`~.precision.PrecisionPlugin`, :class:`~.amp.LossScaling`, :class:`~.devices.Device`;
- :class:`~.accumulation.Accumulation`; :class:`~.preparation.Preparation` and its
  :class:`~.preparation.PreparationStep` (``WindowMean``, ``Reduction``, ``Unscaling``, ``AddCarried``, ``Clipping``);
- :class:`~.parallel.Replicated` and :class:`~.parallel.Sharded`;
- :class:`~.failure.FailurePolicyRule` and its :class:`~.failure.Transaction` (``Discard``, ``Restore``);
- :class:`~.toggling.Toggling`, :class:`~.closures.Closures`, :class:`~.hooks.Hooks`, :class:`~.refusals.Refusals`,
  :class:`~.state.StateFormat`, :class:`~.zeroing.Zeroing` (``ClearAfterStep``, ``LeaveToUser``),
  :class:`~.outside.OutsideChanges`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.amp import LossScaling
from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.reference.devices import Device
from lightning_optimizer.reference.failure import FailurePolicyRule
from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.reference.outside import OutsideChanges
from lightning_optimizer.reference.parallel import DataParallel
from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.reference.preparation import Preparation
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.reference.toggling import Toggling
from lightning_optimizer.reference.zeroing import Zeroing

__all__ = ["COLLABORATORS", "CONSTRUCTION_HOOKS", "STAGE_NAMES", "Parts"]


@dataclass
class Parts:
    """The collaborators a context is composed of; a variant of the reference replaces them (``tests/mutants``).

    Each is one object, with a no-op twin where its concern can be absent (no loss scaling, one process): the
    context never asks which precision, device, data parallelism or failure policy it runs.
    """

    precision: PrecisionPlugin
    """Module casting, the autocast region, where backward passes run [PREC-*, BWD-002]."""
    scaling: LossScaling
    """Loss scaling (16-mixed), or none [AMP-*]."""
    device: Device
    """Where the model lives, and what the device adds around a real step [XLA-001]."""
    accumulation: Accumulation
    """When a micro-step closes its window [STEP-001 to STEP-003, ACC-003]."""
    preparation: Preparation
    """What a window goes through before its real step: mean, reduction, unscaling, clipping [ACC-001, CLIP-001]."""
    parallel: DataParallel
    """One process, DDP or FSDP2: module preparation, sync suppression, the window's tensors [DDP-*, FSDP-*]."""
    failure: FailurePolicyRule
    """What a failed call leaves of its window: discard or restore [FAIL-*]."""
    toggling: Toggling
    """Only one optimizer's parameters require grad inside its closure [TOGGLE-*]."""
    closures: Closures
    """The closures handed to the inner optimizer and its own evaluations [CLOS-002, CLOS-004, CLOS-005]."""
    hooks: Hooks
    """The hooks a framework registered [HOOK-*]."""
    refusals: Refusals
    """Every refusal, before anything changes [ERR-*, REENT-001, CLIP-002]."""
    state: StateFormat
    """The context's checkpoint [CKPT-*]."""
    zeroing: Zeroing
    """What a real step leaves of its gradients: cleared, or left to the user and carried [ZERO-*]."""
    outside: OutsideChanges
    """What changed a window behind its wrapper's back: its parameters, its cleared gradients [WIN-*]."""


COLLABORATORS: frozenset[str] = frozenset(field.name for field in dataclasses.fields(Parts))
"""The collaborators a variant may replace (the fields of ``context.parts``)."""

STAGE_NAMES: frozenset[str] = frozenset({"run_closure", "inner_step", "backward", "new_wrapper"})
"""The stages a variant may override: the user's closure, the inner optimizer's step, a wrapper's backward, the
wrapper object."""

CONSTRUCTION_HOOKS: frozenset[str] = frozenset({"__init__", "__getstate__", "__setstate__", "__deepcopy__"})
"""Besides the stages and the public members, what a variant may replace: how it is built and copied."""
