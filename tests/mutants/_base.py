"""Plumbing shared by the mutants: the reference context, wrapper subclasses, the record.

:class:`MutantContext` is the reference :class:`~lightning_optimizer.reference.TrainingContext`, composed of
collaborators a mutant replaces (``self.parts``) and a few stages it may override. With nothing replaced it is the
reference: ``conformance_info()`` here presents it, unbroken, to the suite as the control that the mutants are
measured against.
"""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.clipping import ClipAlgorithm, check_clipping
from lightning_optimizer.reference.preparation import preparation
from lightning_optimizer.reference.suite_info import conformance_info as reference_conformance_info
from lightning_optimizer.reference.window import Window
from lightning_optimizer.reference.wrapper import wrapper_class
from lightning_optimizer.spec import Cell, FailurePolicy, GradScalerSettings, ImplementationInfo

__all__ = [
    "ClipValueContext",
    "MutantContext",
    "Slot",
    "conformance_info",
    "mutant_info",
    "wrapper_subclass",
]

ContextT = TypeVar("ContextT", bound=TrainingContext)
T = TypeVar("T")
Slot = Window


class MutantContext(TrainingContext):
    """The reference context; a mutant replaces a collaborator (``self.parts``) or overrides a stage.

    ``tests/test_mutants.py`` holds each mutant to that seam (:mod:`lightning_optimizer.reference.stages`): the
    collaborators, the stages, the public members, construction and copies; never the call around the stages.
    """


class ClipValueContext(MutantContext):
    """The reference with its own check of ``gradient_clip_val`` in place of the reference's (CTX-002 mutants)."""

    def __init__(
        self,
        precision: Any = "32-true",
        device: Any = "cpu",
        accumulate_grad_batches: int = 1,
        *,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: ClipAlgorithm = "norm",
        scaler: GradScaler | None = None,
        strategy: Any = "ddp",
        on_failure: Any = "discard",
        zero_grad_after_step: Any = True,
    ) -> None:
        value = None if gradient_clip_val is None else self.clip_value(gradient_clip_val)
        super().__init__(
            precision,
            device,
            accumulate_grad_batches,
            gradient_clip_algorithm=gradient_clip_algorithm,
            scaler=scaler,
            strategy=strategy,
            on_failure=on_failure,
            zero_grad_after_step=zero_grad_after_step,
        )
        self.parts.preparation = preparation(value, gradient_clip_algorithm)

    def clip_value(self, value: float) -> float | None:
        """The clip value the context uses for ``value`` (``None``: no clipping), or a ``ValueError``.

        The reference's check; each CTX-002 mutant replaces it with its own.
        """
        return check_clipping(value, "norm")[0]


def wrapper_subclass(
    mixin: type[WrappedOptimizer[Any]], optimizer_class: type[torch.optim.Optimizer]
) -> type[WrappedOptimizer[Any]]:
    """A wrapper class for ``optimizer_class`` whose members in ``mixin`` replace the reference wrapper's."""
    key = (mixin, optimizer_class)
    cached = _SUBCLASSES.get(key)
    if cached is None:
        bases = (mixin, wrapper_class(optimizer_class))
        cached = type(f"{mixin.__name__}{optimizer_class.__name__}", bases, {"__module__": mixin.__module__})
        _SUBCLASSES[key] = cached
    return cached


_SUBCLASSES: dict[tuple[type[Any], type[Any]], type[WrappedOptimizer[Any]]] = {}


def mutant_info(context_class: type[ContextT], name: str) -> ImplementationInfo[ContextT]:
    """The reference's claims, with ``name`` and a factory that builds ``context_class``."""

    def factory(
        cell: Cell,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: ClipAlgorithm = "norm",
        grad_scaler: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> ContextT:
        scaler = None
        if grad_scaler is not None and cell.precision == "16-mixed":
            scaler = GradScaler(cell.device, **grad_scaler.as_kwargs())
        # Only what the suite asked for: the context's own defaults decide otherwise (FAIL-001, ZERO-003).
        asked: dict[str, Any] = {}
        if on_failure != "discard":
            asked["on_failure"] = on_failure
        if zero_grad_after_step is not True:
            asked["zero_grad_after_step"] = zero_grad_after_step
        return context_class(
            cell.precision,
            cell.device,
            accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            scaler=scaler,
            strategy="fsdp" if cell.strategy == "fsdp" else "ddp",
            **asked,
        )

    info: ImplementationInfo[Any] = dataclasses.replace(
        reference_conformance_info(), name=f"mutant: {name}", factory=factory
    )
    return info


def conformance_info() -> ImplementationInfo[MutantContext]:
    """The control: the hookable context with no hook overridden, which must pass every check."""
    return mutant_info(MutantContext, "none (the control)")
