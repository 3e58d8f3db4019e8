"""What each rank of a DDP cell runs (inside :mod:`lightning_optimizer.conformance.ranks`).

A scenario receives the implementation's record and the cell, trains on the rank's shard of a seeded global
batch, and returns plain data (CPU tensors, counts, outcomes) for the parent to compare with its oracle.
"""

# No ``from __future__ import annotations`` here: DDP checks a communication hook's annotations at run time.
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightning_optimizer.conformance.harness import Batch, cell_device, cell_dtype, make_batches, make_model, mse
from lightning_optimizer.spec import Cell, ImplementationInfo

__all__ = ["rank_batches", "train_windows_on_shards"]

BATCHES = 6
ACCUMULATE = 3
"""Two windows of three micro-steps: a window costs one all-reduce, so the run costs two (not six)."""


def rank_batches(rank: int) -> list[Batch]:
    """Rank ``rank``'s shard of each global batch (the global batch is every rank's shard, in rank order)."""
    return make_batches(BATCHES, seed=100 + rank)


class _Counter:
    """State of :func:`_counting_allreduce`: the gradient all-reduces so far."""

    def __init__(self) -> None:
        self.calls = 0


def _counting_allreduce(state: _Counter, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: count, then do DDP's default all-reduce."""
    state.calls += 1
    hook: Any = default_hooks.allreduce_hook  # its process-group argument may be None (the default group)
    future: torch.futures.Future[torch.Tensor] = hook(None, bucket)
    return future


def train_windows_on_shards(info: ImplementationInfo[Any], cell: Cell, *, form: str) -> dict[str, Any]:
    """Two windows of three micro-steps on this rank's shards, in the closure or the backward-then-step form.

    The backward-then-step form does what the contract asks of it: ``toggle_model(sync_grad=...)`` around the
    backward of every micro-step, syncing only on the one that closes the window [TOGGLE-003].
    """
    rank = dist.get_rank()
    context = info.factory(cell, accumulate_grad_batches=ACCUMULATE)
    model = context.prepare_module(make_model())
    if not isinstance(model, DistributedDataParallel):
        raise AssertionError(
            f"prepare_module returned a {type(model).__name__} in a process group of {dist.get_world_size()} "
            "ranks: the check counts gradient all-reduces through DistributedDataParallel's communication hook"
        )
    counter = _Counter()
    model.register_comm_hook(counter, _counting_allreduce)
    wrapper = context.wrap(torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = rank_batches(rank)
    outcomes = []
    for batch_idx, batch in enumerate(batches):
        closes = (batch_idx + 1) % ACCUMULATE == 0
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            if form == "closure":

                def closure(batch: Batch = batch) -> torch.Tensor:
                    with context.autocast():
                        loss = mse(model, batch, device, dtype)
                    wrapper.backward(loss)
                    return loss

                wrapper.step(closure)
            else:
                with wrapper.toggle_model(sync_grad=closes):
                    with context.autocast():
                        loss = mse(model, batch, device, dtype)
                    wrapper.backward(loss)
                wrapper.step()
        outcomes.append(wrapper.last_outcome)
    return {
        "params": [p.detach().cpu().clone() for p in model.module.parameters()],
        "all_reduces": counter.calls,
        "outcomes": outcomes,
    }
