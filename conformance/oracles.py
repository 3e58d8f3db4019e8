"""Plain PyTorch oracles: what the contract says should happen, computed without any wrapper.

Each oracle is a loop a user could write by hand with a bare ``torch.optim`` optimizer. Windows are given
explicitly by the checks (worked out by hand from the rule), so an oracle never reuses an implementation's
notion of the schedule.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch

from lightning_optimizer.conformance.harness import Batch, cell_device, cell_dtype, mse
from lightning_optimizer.spec import Cell

__all__ = ["oracle_copy", "train_windows"]


def oracle_copy(model: torch.nn.Module, cell: Cell) -> torch.nn.Module:
    """An independent copy of a (CPU, float32) model, on the cell's device and in its parameter dtype."""
    return copy.deepcopy(model).to(device=cell_device(cell), dtype=cell_dtype(cell))


def train_windows(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    batches: Sequence[Batch],
    windows: Sequence[Sequence[int]],
    cell: Cell,
    loss_fn: Callable[[torch.nn.Module, Batch], torch.Tensor] | None = None,
) -> None:
    """One optimizer step per window, on the mean of the window's micro-batch gradients."""
    device, dtype = cell_device(cell), cell_dtype(cell)
    for window in windows:
        optimizer.zero_grad(set_to_none=True)
        for batch_idx in window:
            loss = (
                mse(model, batches[batch_idx], device, dtype) if loss_fn is None else loss_fn(model, batches[batch_idx])
            )
            loss.backward()
        with torch.no_grad():
            for param in model.parameters():
                if param.grad is not None:
                    param.grad /= len(window)
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
