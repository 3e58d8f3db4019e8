"""The preparation of a window for its real step: its steps, in order, once per window.

The window's mean [ACC-001, AMP-007], the cross-replica reduction of the device [XLA-001], the loss scaler's
unscaling [AMP-002], the gradients carried from the last step [ZERO-005], clipping [CLIP-001]: each step is one
object, and :class:`Preparation` runs them in order. An optimizer that evaluates its closure itself has each
evaluation's gradients reduced and clipped (:attr:`Preparation.evaluation`). ``unscale_gradients()`` runs the same
preparation early [CLIP-002].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

import torch

from lightning_optimizer.reference.accumulation import normalise_window
from lightning_optimizer.reference.clipping import ClipAlgorithm, clip_gradients
from lightning_optimizer.reference.window import Window

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

__all__ = [
    "AddCarried",
    "Clipping",
    "Preparation",
    "PreparationStep",
    "Reduction",
    "Unscaling",
    "WindowMean",
    "preparation",
]


class PreparationStep(Protocol):
    """One step of the preparation."""

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """Whether the step changes ``window``'s gradients in place (a restoring policy copies them first)."""
        ...

    def __call__(self, context: TrainingContext, window: Window) -> None:
        """Apply the step to ``window``'s gradients."""
        ...


class WindowMean:
    """The window's summed gradients become their mean (under 16-mixed each loss was divided by N already)."""

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """A window whose length is the divisor its losses had is its own mean."""
        return window.length + 1 != context.parts.scaling.window_divisor(
            context.parts.accumulation.accumulate_grad_batches
        )

    def __call__(self, context: TrainingContext, window: Window) -> None:
        """Divide by the window's length (times the divisor its losses had)."""
        divisor = context.parts.scaling.window_divisor(context.parts.accumulation.accumulate_grad_batches)
        if window.length + 1 != divisor:  # a full window is its mean as it stands
            normalise_window(window.params(), window.length + 1, divided_by=divisor)


class Reduction:
    """The device's cross-replica reduction, where it is not done in backward (XLA)."""

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """Whether the device reduces outside backward."""
        return context.parts.device.reduces_gradients

    def __call__(self, context: TrainingContext, window: Window) -> None:
        """Reduce across replicas."""
        context.parts.device.reduce_gradients(window.optimizer)


class Unscaling:
    """The loss scaler's unscaling (16-mixed), once per optimizer and iteration."""

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """Whether the precision scales losses."""
        return context.parts.scaling.changes_gradients

    def __call__(self, context: TrainingContext, window: Window) -> None:
        """Unscale."""
        context.parts.scaling.unscale(window.optimizer)


class AddCarried:
    """``zero_grad_after_step=False``: the gradients the window carries from the last step, added to its mean.

    After the mean, the reduction and the unscaling, which the carried part went through at its own step, and
    before clipping, which clips what the step applies [ZERO-005]. The carried tensors stay as they are (a failed
    call may put them back).
    """

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """Whether the window carries anything."""
        return bool(window.carried)

    def __call__(self, context: TrainingContext, window: Window) -> None:
        """Add the carried gradients to the parameters' (a copy of them where a parameter has none)."""
        carried = window.carried
        if not carried:
            return
        with torch.no_grad():
            for param, grad in carried.items():
                if param.grad is None:
                    param.grad = grad.clone()
                else:
                    param.grad.add_(grad)


@dataclass(frozen=True)
class Clipping:
    """Gradient clipping by total norm over every parameter of the optimizer, or by value."""

    value: float
    algorithm: ClipAlgorithm = "norm"

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """Clipping may change any gradient."""
        return True

    def __call__(self, context: TrainingContext, window: Window) -> None:
        """Clip the optimizer's gradients."""
        clip_gradients(window.params(), self.value, self.algorithm)


@dataclass(frozen=True)
class Preparation:
    """The steps a window goes through before its real step, in order; ``evaluation``: those of each evaluation."""

    steps: Sequence[PreparationStep]
    evaluation: Sequence[PreparationStep]

    def changes(self, context: TrainingContext, window: Window) -> bool:
        """Whether preparing ``window`` changes any gradient in place."""
        return any(step.changes(context, window) for step in self.steps)

    def prepare(self, context: TrainingContext, window: Window) -> None:
        """Run every step on ``window``, in order (in its closing call, or in ``unscale_gradients()`` before it)."""
        for step in self.steps:
            step(context, window)

    def prepare_evaluation(self, context: TrainingContext, window: Window) -> None:
        """Run the steps of one evaluation of a closure-evaluating optimizer's closure [CLOS-004]."""
        for step in self.evaluation:
            step(context, window)


def preparation(clip_val: float | None, clip_algorithm: ClipAlgorithm) -> Preparation:
    """The contract's order: mean, reduction, unscaling, the carried part, clipping (when configured).

    [AMP-002, CLIP-001, XLA-001, ZERO-005]
    """
    clipping: tuple[PreparationStep, ...] = () if clip_val is None else (Clipping(clip_val, clip_algorithm),)
    steps: tuple[PreparationStep, ...] = (WindowMean(), Reduction(), Unscaling(), AddCarried(), *clipping)
    return Preparation(steps=steps, evaluation=(Reduction(), *clipping))
