"""Plain PyTorch oracles: what the contract says should happen, computed without any wrapper.

Each oracle is a loop a user could write by hand with a bare ``torch.optim`` optimizer, plain ``torch.autocast``
and, under 16-mixed, a plain ``torch.amp.GradScaler`` used as PyTorch documents it. Windows are given
explicitly by the checks (worked out by hand from the rule), so an oracle never reuses an implementation's
notion of the schedule.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch

from lightning_optimizer.conformance.harness import (
    Batch,
    cell_device,
    cell_dtype,
    oracle_scaler,
    oracle_step_done,
)
from lightning_optimizer.conformance.plain_loop import (
    ClipFunction,
    oracle_loss,
    real_step,
    scaled_backward,
    train_windows,
    update_scaler,
    window_mean,
)
from lightning_optimizer.spec import Cell, StepOutcome

__all__ = [
    "WindowOracle",
    "expected_outcomes",
    "oracle_copy",
    "oracle_mean_steps",
    "recipe_backward",
    "recipe_window_mean",
]


def oracle_copy(model: torch.nn.Module, cell: Cell) -> torch.nn.Module:
    """An independent copy of a (CPU, float32) model, on the cell's device and in its parameter dtype."""
    return copy.deepcopy(model).to(device=cell_device(cell), dtype=cell_dtype(cell))


recipe_backward = scaled_backward
"""A micro-step's backward as torch's AMP recipe runs it (:func:`.plain_loop.scaled_backward`) [AMP-007]."""
recipe_window_mean = window_mean
"""The window's mean from what :func:`recipe_backward` summed (:func:`.plain_loop.window_mean`) [ACC-001]."""


class WindowOracle:
    """A model and a bare optimizer, trained one window of micro-batches at a time."""

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, cell: Cell, accumulate_grad_batches: int = 1
    ) -> None:
        self.model, self.optimizer, self.cell = model, optimizer, cell
        self.accumulate_grad_batches = accumulate_grad_batches
        """The recipe's divisor of each 16-mixed loss (the implementation's ``accumulate_grad_batches``)."""
        self.scaler = oracle_scaler(cell)
        self.stepped: list[bool] = []
        """For each window so far: whether it stepped (``False``: 16-mixed skipped it, the scale backed off)."""

    def train_windows(
        self,
        batches: Sequence[Batch],
        windows: Sequence[Sequence[int]],
        *,
        factor: float = 1.0,
        clip: ClipFunction | None = None,
    ) -> None:
        """One optimizer step per window, on the mean of the window's micro-batch gradients.

        Each loss is ``factor`` times the MSE. Under 16-mixed each loss is scaled as the recipe does
        (:func:`recipe_backward`); the mean is unscaled once, clipped by ``clip`` (configured clipping), stepped, and
        the scaler updated once.
        """
        self.optimizer.zero_grad(set_to_none=True)
        n = self.accumulate_grad_batches
        self.stepped += train_windows(
            self.cell, self.model, self.optimizer, batches, windows, self.scaler, accumulate=n, factor=factor, clip=clip
        )


def oracle_mean_steps(
    modules: Sequence[torch.nn.Module],
    batches: Sequence[Batch],
    cell: Cell,
    lr: float,
    loss_factor: float,
    *,
    windows: Sequence[Sequence[int]] | None = None,
) -> None:
    """Each module one SGD step (``lr``) on the mean of its gradients over ``batches``, in order; one scaler for all.

    ``windows`` gives each module its own window instead (indices into ``batches``). Under 16-mixed one plain
    ``GradScaler`` scales every backward, unscales and steps each module's optimizer, and updates once at the end,
    as one training iteration of several optimizers does.
    """
    scaler = oracle_scaler(cell)
    for index, module in enumerate(modules):
        optimizer = torch.optim.SGD(module.parameters(), lr=lr)
        window = batches if windows is None else [batches[batch_idx] for batch_idx in windows[index]]
        for batch in window:
            scaled_backward(oracle_loss(module, batch, cell, factor=loss_factor), scaler)
        real_step(optimizer, len(window), scaler)
    update_scaler(scaler)
    oracle_step_done(cell)


def expected_outcomes(pattern: Sequence[StepOutcome], stepped: Sequence[bool]) -> list[StepOutcome]:
    """``pattern`` with its ``STEPPED`` entries, in order, made ``SKIPPED_NON_FINITE`` where a window skipped."""
    windows = iter(stepped)
    return [
        outcome if outcome is not StepOutcome.STEPPED or next(windows) else StepOutcome.SKIPPED_NON_FINITE
        for outcome in pattern
    ]
