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
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.harness import (
    Batch,
    cell_device,
    cell_dtype,
    mse,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
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


def recipe_backward(
    loss: torch.Tensor,
    scaler: GradScaler | None,
    accumulate_grad_batches: int = 1,
    *,
    scales: list[float] | None = None,
) -> None:
    """A micro-step's backward as torch's AMP recipe runs it: under 16-mixed ``scaler.scale(loss / N)`` [AMP-007].

    Call it outside the forward's autocast region, where the recipe runs backward passes [BWD-002]. ``scales``
    receives the factor the loss is backpropagated by (the gradient reaching it), under 16-mixed only: what the
    checks record of an implementation's backward the same way.
    """
    if scales is not None and scaler is not None:
        loss.register_hook(lambda grad: scales.append(float(grad)))
    if scaler is None:
        loss.backward()
    else:
        scaler.scale(loss / accumulate_grad_batches).backward()


def recipe_window_mean(
    params: Sequence[torch.Tensor], window_length: int, scaler: GradScaler | None, accumulate_grad_batches: int = 1
) -> None:
    """The window's mean [ACC-001] from the sum that :func:`recipe_backward` accumulated.

    Under 16-mixed each micro-step was divided by ``accumulate_grad_batches`` already: the sum is multiplied by
    ``N / window_length``; otherwise it is divided by ``window_length``.
    """
    divided_by = 1 if scaler is None else accumulate_grad_batches
    if window_length == divided_by:
        return
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                if divided_by == 1:
                    param.grad /= window_length
                else:
                    param.grad *= divided_by / window_length


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

    def train_windows(self, batches: Sequence[Batch], windows: Sequence[Sequence[int]]) -> None:
        """One optimizer step per window, on the mean of the window's micro-batch gradients.

        Under 16-mixed each loss is scaled as the recipe does (:func:`recipe_backward`); the mean is unscaled once,
        stepped, and the scaler updated once.
        """
        device, dtype = cell_device(self.cell), cell_dtype(self.cell)
        for window in windows:
            self.optimizer.zero_grad(set_to_none=True)
            for batch_idx in window:
                with oracle_autocast(self.cell):
                    loss = mse(self.model, batches[batch_idx], device, dtype)
                recipe_backward(loss, self.scaler, self.accumulate_grad_batches)
            recipe_window_mean(list(self.model.parameters()), len(window), self.scaler, self.accumulate_grad_batches)
            if self.scaler is None:
                self.optimizer.step()
                self.stepped.append(True)
            else:
                scale = self.scaler.get_scale()
                self.scaler.unscale_(self.optimizer)
                self.scaler.step(self.optimizer)
                self.scaler.update()
                self.stepped.append(self.scaler.get_scale() >= scale)
            oracle_step_done(self.cell)
        self.optimizer.zero_grad(set_to_none=True)


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
    device, dtype = cell_device(cell), cell_dtype(cell)
    scaler = oracle_scaler(cell)
    for index, module in enumerate(modules):
        optimizer = torch.optim.SGD(module.parameters(), lr=lr)
        window = batches if windows is None else [batches[batch_idx] for batch_idx in windows[index]]
        for batch in window:
            with oracle_autocast(cell):
                loss = mse(module, batch, device, dtype) * loss_factor
            (loss if scaler is None else scaler.scale(loss)).backward()
        with torch.no_grad():
            for param in module.parameters():
                assert param.grad is not None
                param.grad /= len(window)
        if scaler is None:
            optimizer.step()
        else:
            scaler.unscale_(optimizer)
            scaler.step(optimizer)
    if scaler is not None:
        scaler.update()
    oracle_step_done(cell)


def expected_outcomes(pattern: Sequence[StepOutcome], stepped: Sequence[bool]) -> list[StepOutcome]:
    """``pattern`` with its ``STEPPED`` entries, in order, made ``SKIPPED_NON_FINITE`` where a window skipped."""
    windows = iter(stepped)
    return [
        outcome if outcome is not StepOutcome.STEPPED or next(windows) else StepOutcome.SKIPPED_NON_FINITE
        for outcome in pattern
    ]
