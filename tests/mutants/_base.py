"""Plumbing shared by the mutants: a reference context with hook points, wrapper subclasses, the record.

:class:`MutantContext` is the reference :class:`~lightning_optimizer.reference.TrainingContext` with its ``_step``
restated in small overridable pieces (the reference decides, normalises and steps inline). With no hook
overridden it behaves exactly like the reference: ``conformance_info()`` here presents it, unbroken, to the suite
as the control that the mutants are measured against.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.accumulation import closes_window, normalise_window
from lightning_optimizer.reference.conformance import conformance_info as reference_conformance_info
from lightning_optimizer.reference.context import _Slot
from lightning_optimizer.reference.wrapper import wrapper_class
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome

__all__ = ["MutantContext", "Slot", "conformance_info", "mutant_info", "wrapper_subclass"]

ContextT = TypeVar("ContextT", bound=TrainingContext)
T = TypeVar("T")
Slot = _Slot


class MutantContext(TrainingContext):
    """The reference context, with ``_step`` split into hooks that a mutant overrides one at a time."""

    def _step(
        self,
        index: int,
        closure: Callable[[], T] | None,
        make_optimizer_step: bool | None,
        kwargs: dict[str, Any],
    ) -> T | None:
        self._check_step_arguments(closure, make_optimizer_step)
        slot = self._slots[index]
        real = self._closes_window(slot, make_optimizer_step)
        if slot.evaluates_closure:
            name = type(slot.optimizer).__name__
            if not real:
                raise ValueError(f"{name} evaluates its closure several times per step and cannot accumulate")
            if closure is None:
                raise TypeError(f"{name} needs a closure: call step(closure)")
            return self._closure_evaluating_step(index, closure, kwargs)
        result = None if closure is None else self._run_closure(index, closure)
        if not real:
            slot.pending += 1
            slot.last_outcome = StepOutcome.ACCUMULATED
            return result
        self._normalise_window(slot)
        self._inner_step(index, closure, kwargs)
        self._finish_real_step(slot)
        return result

    # -- the hooks ---------------------------------------------------------------------------------------

    def _check_step_arguments(self, closure: object, make_optimizer_step: object) -> None:
        """ERR-001 and ERR-002: refuse bad arguments before anything runs."""
        if closure is not None and not callable(closure):
            raise TypeError(f"closure must be callable or None, got {type(closure).__name__}")
        if make_optimizer_step is not None and not isinstance(make_optimizer_step, bool):
            raise TypeError(f"make_optimizer_step must be True, False or None, got {make_optimizer_step!r}")

    def _closes_window(self, slot: Slot, make_optimizer_step: bool | None) -> bool:
        """STEP-001 to STEP-003: whether this micro-step takes the real step."""
        return closes_window(
            make_optimizer_step,
            pending=slot.pending,
            accumulate_grad_batches=self._accumulate_grad_batches,
            position=self._position,
        )

    def _normalise_window(self, slot: Slot) -> None:
        """ACC-001: turn the window's summed gradients into their mean."""
        normalise_window(slot.params(), slot.pending + 1)

    def _inner_step(self, index: int, closure: Callable[[], Any] | None, kwargs: dict[str, Any]) -> None:
        """STEP-005: the inner optimizer's real step (the closure has already run)."""
        self._slots[index].optimizer.step(**kwargs)


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

    def factory(cell: Cell, *, accumulate_grad_batches: int = 1) -> ContextT:
        return context_class(cell.precision, cell.device, accumulate_grad_batches=accumulate_grad_batches)

    info: ImplementationInfo[Any] = dataclasses.replace(
        reference_conformance_info(), name=f"mutant: {name}", factory=factory
    )
    return info


def conformance_info() -> ImplementationInfo[MutantContext]:
    """The control: the hookable context with no hook overridden, which must pass every check."""
    return mutant_info(MutantContext, "none (the control)")
