"""FSDP2: shard a module with ``fully_shard``, and reach what a window accumulates without gradient sync.

A backward without sync (``set_requires_gradient_sync(False)``) leaves each rank's gradient of its own batch
shard on the *unsharded* parameter, full size, unreduced; the sharded parameter the optimizer holds gets nothing
until the backward that syncs reduce-scatters the whole sum. So an open window's gradients live in two places:
the sharded ``.grad`` (what synced backwards gave) and the unsharded ``.grad`` (what the micro-steps without sync
added since). :func:`unsynced_gradients` finds the second, for the transactions, the scaler's rescaling of open
windows and checkpoints.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import ExitStack, contextmanager

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from lightning_optimizer.reference import torch_compat

__all__ = [
    "fsdp_modules",
    "gather_for_load",
    "shard_module",
    "unsharded_by_param",
    "unsynced_gradients",
    "without_gradient_sync",
]


def shard_module(module: torch.nn.Module, device: torch.device, world_size: int) -> torch.nn.Module:
    """``module`` sharded over ``world_size`` ranks (in place), or as it is when it is an ``FSDPModule`` already.

    The policy: every submodule that holds parameters of its own (a ``Linear``, a ``LayerNorm``) becomes one FSDP
    unit, innermost first, then the root takes what is left; each unit all-gathers before its forward and
    reshards after its backward (FSDP2's defaults). A module sharded by the user keeps the user's policy, except
    one whose mixed-precision policy reduces in another dtype than its parameters', which is refused. A module
    that holds FSDP units already (the user sharded its blocks, as Lightning's ``configure_model`` does) counts
    as sharded by the user.
    """
    if not fsdp_modules([module]):
        mesh: DeviceMesh = init_device_mesh(device.type, (world_size,))
        for sub in reversed(list(module.modules())[1:]):
            if next(sub.parameters(recurse=False), None) is not None:
                fully_shard(sub, mesh=mesh)
        fully_shard(module, mesh=mesh)
    for sub in fsdp_modules([module]):
        if torch_compat.fsdp_accumulates_elsewhere(sub):
            raise ValueError(
                f"the FSDP unit {type(sub).__name__} has a MixedPrecisionPolicy whose reduce_dtype differs from its "
                "param_dtype: the reference cannot keep such a window's unsynced gradients transactional; shard it "
                "without reduce_dtype (or with reduce_dtype equal to param_dtype)"
            )
    return module


def fsdp_modules(modules: Iterable[torch.nn.Module]) -> list[torch.nn.Module]:
    """Every FSDP unit among ``modules`` and their submodules, each once."""
    found: dict[int, torch.nn.Module] = {}
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, FSDPModule):
                found.setdefault(id(sub), sub)
    return list(found.values())


@contextmanager
def without_gradient_sync(units: Iterable[torch.nn.Module]) -> Iterator[None]:
    """Backward passes inside run without reduce-scatter on each FSDP unit given; sync is on again after."""
    with ExitStack() as stack:
        for unit in units:
            assert isinstance(unit, FSDPModule)
            unit.set_requires_gradient_sync(False, recurse=False)
            stack.callback(unit.set_requires_gradient_sync, True, recurse=False)
        yield


def unsharded_by_param(units: Iterable[torch.nn.Module]) -> dict[int, torch.Tensor]:
    """For each sharded parameter of these FSDP units (by ``id``), its unsharded parameter, where FSDP made one."""
    return {
        id(sharded): unsharded
        for unit in units
        for sharded, unsharded in torch_compat.fsdp_unsharded_params(unit).items()
    }


def unsynced_gradients(units: Iterable[torch.nn.Module], params: Iterable[torch.Tensor]) -> list[torch.Tensor]:
    """The unsharded parameters of these sharded ``params``, whose ``.grad`` is what no sync has reduced yet."""
    unsharded = unsharded_by_param(units)
    return [unsharded[id(param)] for param in params if id(param) in unsharded]


def gather_for_load(units: Iterable[torch.nn.Module]) -> list[FSDPModule]:
    """All-gather every unit once (a collective), so that each sharded parameter has its unsharded one.

    Returns the units; the caller reshards them (``reshard()``) once the restored gradients are in place.
    """
    gathered: list[FSDPModule] = []
    for unit in units:
        assert isinstance(unit, FSDPModule)
        unit.unshard()
        gathered.append(unit)
    return gathered
