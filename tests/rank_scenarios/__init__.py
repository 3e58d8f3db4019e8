"""Scenarios for the rank pool's own tests: a rank that raises, dies or hangs, also inside an open window."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from lightning_optimizer.conformance.harness import cell_device, cell_dtype, make_batches, make_model, mse
from lightning_optimizer.spec import Cell, ImplementationInfo, StepOutcome

FAILING_MICRO_STEP = 1
"""The micro-step (batch) at which rank 1 fails in the mid-window scenarios: the window {0, 1, 2} is open."""


def rank_and_size(info: ImplementationInfo[Any], cell: Cell) -> tuple[int, int]:
    return dist.get_rank(), dist.get_world_size()


def raises_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> None:
    if dist.get_rank() == 1:
        raise ValueError("rank 1 fails on purpose")
    dist.barrier()


def dies_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> None:
    if dist.get_rank() == 1:
        os._exit(3)
    dist.barrier()


def aborts_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> None:
    """Rank 1 aborts as a native library does, after writing a line to its standard error."""
    if dist.get_rank() == 1:
        os.write(2, b"terminate called after throwing an instance of 'on purpose'\n")
        os.abort()
    dist.barrier()


def aborts_once_on_rank_1(info: ImplementationInfo[Any], cell: Cell, marker: str) -> int:
    """Rank 1 aborts the first time (when ``marker`` does not exist yet, which it then creates); then passes."""
    if dist.get_rank() == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.abort()
    dist.barrier()
    return dist.get_rank()


def hangs_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> None:
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()


def _raise() -> None:
    raise ValueError("rank 1 fails mid-window on purpose")


def _die() -> None:
    os._exit(3)


def _train_one_window(
    info: ImplementationInfo[Any], cell: Cell, fault: Callable[[], None] | None, micro_steps: int = 3
) -> list[StepOutcome | None]:
    """DDP over (the first ``micro_steps`` of) a window of three; rank 1's closure calls ``fault`` inside it.

    The micro-steps before the fault accumulated under ``no_sync``; rank 0 goes on to the window's last
    micro-step, whose backward pass waits in DDP's gradient all-reduce for a rank that is gone.
    """
    context = info.factory(cell, accumulate_grad_batches=3)
    model = context.prepare_module(make_model())
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1))
    batches = make_batches(3, seed=100 + dist.get_rank())
    outcomes = []
    for batch_idx, batch in enumerate(batches[:micro_steps]):
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):

            def closure(batch: Any = batch, batch_idx: int = batch_idx) -> torch.Tensor:
                if fault is not None and dist.get_rank() == 1 and batch_idx == FAILING_MICRO_STEP:
                    fault()
                with context.autocast():
                    loss = mse(model, batch, cell_device(cell), cell_dtype(cell))
                wrapper.backward(loss)
                return loss

            wrapper.step(closure)
        outcomes.append(wrapper.last_outcome)
        if batch_idx < FAILING_MICRO_STEP and outcomes[-1] is not StepOutcome.ACCUMULATED:
            raise AssertionError(f"micro-step {batch_idx} did not accumulate ({outcomes[-1]}): no window is open")
    return outcomes


def builds_a_ddp_window(info: ImplementationInfo[Any], cell: Cell) -> list[StepOutcome | None]:
    """One accumulating micro-step under DDP: imports and first calls done before a scenario that is timed."""
    return _train_one_window(info, cell, None, micro_steps=1)


def raises_mid_window_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> list[StepOutcome | None]:
    return _train_one_window(info, cell, _raise)


def dies_mid_window_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> list[StepOutcome | None]:
    return _train_one_window(info, cell, _die)
