"""What each rank of a DDP cell runs (inside :mod:`lightning_optimizer.conformance.ranks`).

A scenario receives the implementation's record and the cell, trains on the rank's shard of a seeded global
batch, and returns plain data (CPU tensors, counts, outcomes) for the parent to compare with its oracle.
"""

# No ``from __future__ import annotations`` here: DDP checks a communication hook's annotations at run time.
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from lightning_optimizer.conformance.harness import (
    Batch,
    build_context,
    cell_device,
    cell_dtype,
    make_batches,
    make_model,
    mse,
)
from lightning_optimizer.spec import Cell, ImplementationInfo

__all__ = [
    "ACCUMULATE",
    "EPOCH",
    "LOSS_FACTOR",
    "MODULES",
    "ModuleSpec",
    "build_model",
    "build_optimizer",
    "global_batches",
    "rank_batches",
    "train_epoch_on_shards",
]

EPOCH = 7
"""Batches in the epoch: with ``ACCUMULATE`` micro-steps a window, the schedule alone closes batches 2 and 5 and
flushes batch 6 (the last)."""
ACCUMULATE = 3
LOSS_FACTOR = 1e-3
"""Every loss is multiplied by this: it keeps scaled fp16 gradients finite at GradScaler's initial scale."""


@dataclass(frozen=True)
class ModuleSpec:
    """One prepared module of a scenario and its optimizer (plain SGD, with momentum when ``momentum`` > 0)."""

    seed: int
    sizes: tuple[int, ...]
    lr: float
    momentum: float


MODULES: dict[str, ModuleSpec] = {
    "a": ModuleSpec(seed=0, sizes=(4, 8, 2), lr=10.0, momentum=0.9),
    "b": ModuleSpec(seed=1, sizes=(4, 6, 2), lr=20.0, momentum=0.0),
}
"""The modules a scenario can prepare, by name; the learning rates make up for ``LOSS_FACTOR``."""


def build_model(name: str) -> torch.nn.Module:
    """Module ``name`` of :data:`MODULES`, seeded, on the CPU in float32."""
    spec = MODULES[name]
    return make_model(seed=spec.seed, sizes=spec.sizes)


def build_optimizer(name: str, params: Iterable[torch.nn.Parameter]) -> torch.optim.SGD:
    """The optimizer of module ``name`` of :data:`MODULES`, on ``params``."""
    spec = MODULES[name]
    return torch.optim.SGD(params, lr=spec.lr, momentum=spec.momentum)


def rank_batches(rank: int, count: int = EPOCH) -> list[Batch]:
    """Rank ``rank``'s shard of each global batch (the global batch is every rank's shard, in rank order)."""
    return make_batches(count, seed=100 + rank)


def global_batches(world_size: int, count: int = EPOCH) -> list[Batch]:
    """Each global batch: the concatenation of every rank's shard, in rank order."""
    return [
        (torch.cat([shard[0] for shard in shards]), torch.cat([shard[1] for shard in shards]))
        for shards in zip(*(rank_batches(rank, count) for rank in range(world_size)), strict=True)
    ]


class _Reduces:
    """State of :func:`_recording_allreduce`: one module's gradient all-reduces so far."""

    def __init__(self) -> None:
        self.batch = -1
        """The batch the loop is in (set by the scenario before each one)."""
        self.calls: list[tuple[int, int, bool]] = []
        """Each call of the hook: the batch, the bucket's index, whether it is the last bucket of its round."""


def _recording_allreduce(state: _Reduces, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: record the call, then do DDP's default all-reduce."""
    state.calls.append((state.batch, bucket.index(), bucket.is_last()))
    hook: Any = default_hooks.allreduce_hook  # its process-group argument may be None (the default group)
    future: torch.futures.Future[torch.Tensor] = hook(None, bucket)
    return future


def train_epoch_on_shards(
    info: ImplementationInfo[Any],
    cell: Cell,
    *,
    form: str,
    modules: Sequence[str],
    make_optimizer_step: Sequence[Sequence[bool | None]],
    sync_at: Sequence[Sequence[int]],
    plain_backward: Sequence[bool],
) -> dict[str, Any]:
    """One epoch of ``EPOCH`` batches on this rank's shards, with one wrapper per prepared module.

    Each batch is a ``context.batch`` block in which every module, in order, takes one micro-step on the batch
    with its own wrapper: ``step(closure, make_optimizer_step=...)`` (``form="closure"``), or the forward and
    backward inside ``toggle_model(sync_grad=...)`` and then ``step(make_optimizer_step=...)``
    (``form="toggle"``), syncing only on the micro-steps in ``sync_at`` (those that close the module's window, as
    the check works them out) [TOGGLE-003]. A module's backward is ``wrapper.backward(loss)``, or
    ``loss.backward()`` where ``plain_backward`` says so. Each module's gradient all-reduces are recorded by a
    communication hook of its own.

    Returns, per batch, every module's parameters after it (``params[batch][module]``) and every wrapper's
    ``last_outcome`` after each module's call (``outcomes[batch][module]``), and per module its hook's calls.
    """
    rank = dist.get_rank()
    context = build_context(info.factory, cell, accumulate_grad_batches=ACCUMULATE)
    prepared = [context.prepare_module(build_model(name)) for name in modules]
    reduces = [_Reduces() for _ in modules]
    ddp_modules: list[DistributedDataParallel] = []
    for name, model, state in zip(modules, prepared, reduces, strict=True):
        if not isinstance(model, DistributedDataParallel):
            raise AssertionError(
                f"prepare_module returned a {type(model).__name__} for module {name!r} in a process group of "
                f"{dist.get_world_size()} ranks: the check counts gradient all-reduces through "
                "DistributedDataParallel's communication hook"
            )
        model.register_comm_hook(state, _recording_allreduce)
        ddp_modules.append(model)
    wrappers = [
        context.wrap(build_optimizer(name, model.parameters())) for name, model in zip(modules, prepared, strict=True)
    ]
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = rank_batches(rank)
    params: list[list[list[torch.Tensor]]] = []
    outcomes: list[list[list[Any]]] = []
    for batch_idx, batch in enumerate(batches):
        for state in reduces:
            state.batch = batch_idx
        outcomes.append([])
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            for j, (model, wrapper) in enumerate(zip(prepared, wrappers, strict=True)):
                backward: Callable[[torch.Tensor], None] = _plain_backward if plain_backward[j] else wrapper.backward

                def loss_of(model: torch.nn.Module = model, batch: Batch = batch) -> torch.Tensor:
                    with context.autocast():
                        return mse(model, batch, device, dtype) * LOSS_FACTOR

                if form == "closure":

                    def closure(
                        loss_of: Callable[[], torch.Tensor] = loss_of,
                        backward: Callable[[torch.Tensor], None] = backward,
                    ) -> torch.Tensor:
                        loss = loss_of()
                        backward(loss)
                        return loss

                    wrapper.step(closure, make_optimizer_step=make_optimizer_step[j][batch_idx])
                elif form == "toggle":
                    with wrapper.toggle_model(sync_grad=batch_idx in sync_at[j]):
                        backward(loss_of())
                    wrapper.step(make_optimizer_step=make_optimizer_step[j][batch_idx])
                else:
                    raise ValueError(f"unknown call form {form!r}")
                outcomes[-1].append([w.last_outcome for w in wrappers])
        params.append([[p.detach().cpu().clone() for p in model.module.parameters()] for model in ddp_modules])
    return {"params": params, "outcomes": outcomes, "reduces": [state.calls for state in reduces]}


def _plain_backward(loss: torch.Tensor) -> None:
    loss.backward()
