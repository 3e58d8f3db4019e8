"""Data parallelism: DDP (or FSDP2, :mod:`.fsdp`) when several ranks run; no gradient sync inside a window."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from lightning_optimizer.reference.fsdp import shard_module, without_gradient_sync

__all__ = ["distributed_world_size", "no_sync", "prepare_for_ranks", "syncs_in_backward", "wrap_for_ddp"]


def distributed_world_size() -> int:
    """The size of the default process group, 1 when there is none."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def wrap_for_ddp(module: torch.nn.Module, device: torch.device) -> torch.nn.Module:
    """``module`` in ``DistributedDataParallel`` when several ranks run, as it is otherwise."""
    if distributed_world_size() == 1 or isinstance(module, DistributedDataParallel):
        return module
    device_ids = [device.index] if device.type == "cuda" else None
    return DistributedDataParallel(module, device_ids=device_ids)


def prepare_for_ranks(module: torch.nn.Module, device: torch.device, *, shard: bool) -> torch.nn.Module:
    """``module`` sharded with FSDP2 (``shard``) or in DDP when several ranks run, as it is on one rank."""
    if shard:
        return shard_module(module, device, distributed_world_size())
    return wrap_for_ddp(module, device)


def syncs_in_backward(modules: Iterable[torch.nn.Module]) -> bool:
    """Whether a backward through these modules reduces the accumulated gradients (DDP outside ``no_sync``).

    FSDP units (anywhere inside the modules, :func:`.fsdp.fsdp_modules`) do too; the context asks for those itself.
    """
    return any(isinstance(module, DistributedDataParallel) for module in modules)


@contextmanager
def no_sync(modules: Iterable[torch.nn.Module], units: Iterable[torch.nn.Module] = ()) -> Iterator[None]:
    """Every DDP module's ``no_sync()`` and the sync of each FSDP unit in ``units`` off at once: no reduction inside."""
    with ExitStack() as stack:
        for module in modules:
            if isinstance(module, DistributedDataParallel):
                stack.enter_context(module.no_sync())
        stack.enter_context(without_gradient_sync(units))
        yield
