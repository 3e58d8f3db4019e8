"""Data parallelism behind one object: a single process or DDP (:class:`Replicated`), or FSDP2 (:class:`Sharded`).

Each says how a module is prepared, how micro-steps that do not close a window run without gradient sync, which
tensors hold a window's gradients, whether a closing step's window was synced, and how an open window is saved and
restored. The context holds one and asks it; it never asks which kind it is. [DDP-001, DDP-002, FSDP-001 to
FSDP-006]
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from lightning_optimizer.reference.fsdp import (
    fsdp_modules,
    gather_for_load,
    shard_module,
    unsharded_by_param,
    unsynced_gradients,
    without_gradient_sync,
)
from lightning_optimizer.reference.window import Window

__all__ = [
    "DataParallel",
    "Replicated",
    "Sharded",
    "as_shard_of",
    "data_parallel",
    "distributed_world_size",
    "local_shard",
    "no_sync",
]

_NOTHING = nullcontext()

WindowEntry = dict[str, Any]
"""One optimizer's entry of a context state: counts, shapes, and the open window's gradients."""


def distributed_world_size() -> int:
    """The size of the default process group, 1 when there is none."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


@contextmanager
def no_sync(modules: Iterable[torch.nn.Module], units: Iterable[torch.nn.Module] = ()) -> Iterator[None]:
    """Every DDP module's ``no_sync()`` and the sync of each FSDP unit in ``units`` off at once: no reduction inside."""
    with ExitStack() as stack:
        for module in modules:
            if isinstance(module, DistributedDataParallel):
                stack.enter_context(module.no_sync())
        stack.enter_context(without_gradient_sync(units))
        yield


class Replicated:
    """One process, or DDP over every rank of the process group (``strategy="ddp"``) [DDP-001, DDP-002]."""

    def __init__(self, modules: Iterable[torch.nn.Module] = ()) -> None:
        self.modules = list(modules)
        self.syncs_in_backward = any(isinstance(module, DistributedDataParallel) for module in self.modules)
        """Whether the closing backward reduces the window itself (so the window cannot be set aside before it)."""

    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        """``module`` ready for the ranks, and the data parallelism that goes on with it.

        ``module`` in ``DistributedDataParallel`` when several ranks run; one the user sharded (blocks of) with FSDP
        is kept, and FSDP's rules hold from then on.
        """
        if fsdp_modules([module]):
            return module, Sharded([*self.modules, module])
        if distributed_world_size() > 1 and not isinstance(module, DistributedDataParallel):
            module = DistributedDataParallel(module, device_ids=[device.index] if device.type == "cuda" else None)
        return module, Replicated([*self.modules, module])

    def without_sync(self) -> AbstractContextManager[None]:
        """The region of a micro-step that does not close its window: every DDP module's ``no_sync()`` [DDP-001]."""
        return no_sync(self.modules) if self.syncs_in_backward else _NOTHING

    def without_sync_of_others(self, params: Iterable[torch.Tensor]) -> AbstractContextManager[None]:
        """The region of a micro-step that syncs: every DDP module holding none of ``params`` under ``no_sync()``.

        Toggling keeps such a module out of the backward pass, yet its forward under sync would leave its reducer
        waiting for that backward, and the next backward through it, even one under ``no_sync()``, would then
        all-reduce [DDP-001].
        """
        ids = {id(param) for param in params}
        others = [
            module
            for module in self.modules
            if isinstance(module, DistributedDataParallel) and not any(id(p) in ids for p in module.parameters())
        ]
        return no_sync(others) if others else _NOTHING

    def window_tensors(self, window: Window) -> list[torch.Tensor]:
        """Every tensor whose ``.grad`` holds part of ``window``."""
        return window.params()

    def check_synced(self, window: Window) -> None:
        """Refuse a real step of a window whose gradients no backward synced (DDP syncs in every closing backward)."""

    def clear_unsynced(self, window: Window) -> None:
        """A ``zero_grad()`` of an empty window: what a backward without sync left is cleared too (here: nothing)."""

    def open_window_state(self, window: Window) -> WindowEntry:
        """The open window's gradients (this rank's), for ``state_dict()`` [CKPT-002]."""
        params = window.params()
        if window.length == 0:
            return {"grads": [None] * len(params)}
        return {"grads": [None if p.grad is None else p.grad.detach().clone() for p in params]}

    def check_window_state(self, index: int, params: list[torch.Tensor], entry: WindowEntry) -> None:
        """Refuse an entry whose gradients this data parallelism cannot restore (CKPT-003): any is fine here."""

    def load_windows(self, windows: list[Window], entries: list[WindowEntry]) -> None:
        """Restore the open windows' gradients (checked already)."""
        for window, entry in zip(windows, entries, strict=True):
            with torch.no_grad():
                for param, grad in zip(window.params(), entry["grads"], strict=True):
                    param.grad = None if grad is None else grad.to(device=param.device, dtype=param.dtype).clone()


DataParallel = Replicated
"""What the context asks of data parallelism: :class:`Replicated` answers it, :class:`Sharded` differently."""


class Sharded(Replicated):
    """FSDP2: modules sharded with ``fully_shard`` (by the context or the user) [FSDP-001 to FSDP-006].

    What micro-steps without sync accumulate lives on FSDP's unsharded parameters (:mod:`.fsdp`): those belong to
    the window, for the failure policy, the loss scaler's rescaling and checkpoints.
    """

    def __init__(self, modules: Iterable[torch.nn.Module] = ()) -> None:
        super().__init__(modules)
        self.units = fsdp_modules(self.modules)
        self.syncs_in_backward = True  # FSDP units reduce in every backward that syncs

    def prepare(self, module: torch.nn.Module, device: torch.device) -> tuple[torch.nn.Module, DataParallel]:
        """``module`` sharded over every rank (one unit per submodule with parameters, then the root) [FSDP-001]."""
        module = shard_module(module, device, distributed_world_size())
        return module, Sharded([*self.modules, module])

    def without_sync(self) -> AbstractContextManager[None]:
        """Every DDP module's ``no_sync()`` and every FSDP unit's sync off [FSDP-002]."""
        return no_sync(self.modules, self.units)

    def window_tensors(self, window: Window) -> list[torch.Tensor]:
        """The parameters, and the unsharded parameters whose ``.grad`` holds what no sync reduced yet."""
        params = window.params()
        return params + unsynced_gradients(self.units, params)

    def check_synced(self, window: Window) -> None:
        """Refuse a real step whose window holds gradients that no backward reduce-scattered [FSDP-005]."""
        if any(tensor.grad is not None for tensor in unsynced_gradients(self.units, window.params())):
            raise RuntimeError(
                f"the window of {type(window.optimizer).__name__} holds gradients that no backward synced (its last "
                "backward ran inside toggle_model(sync_grad=False)), so they never reached the shards: run the "
                "backward of the micro-step that closes the window with sync_grad=True"
            )

    def clear_unsynced(self, window: Window) -> None:
        """A backward without sync that no step followed: its unsharded gradients go too."""
        for unsharded in unsynced_gradients(self.units, window.params()):
            unsharded.grad = None

    def open_window_state(self, window: Window) -> WindowEntry:
        """``grads``: the unsynced sums (full size, this rank's batches); ``sharded_grads``: the local shards."""
        params = window.params()
        if window.length == 0:
            return {"grads": [None] * len(params), "sharded_grads": [None] * len(params)}
        unsynced = unsharded_by_param(self.units)
        grads: list[torch.Tensor | None] = []
        for param in params:
            full = unsynced.get(id(param))
            grads.append(None if full is None or full.grad is None else full.grad.detach().clone())
        sharded = [None if p.grad is None else local_shard(p.grad).detach().clone() for p in params]
        return {"grads": grads, "sharded_grads": sharded}

    def check_window_state(self, index: int, params: list[torch.Tensor], entry: WindowEntry) -> None:
        """The state's local shards match this rank's [FSDP-006]."""
        shards = entry.get("sharded_grads")
        if not isinstance(shards, list) or len(shards) != len(params):
            raise ValueError(
                f"optimizer {index}: the state holds no sharded gradients for its {len(params)} parameters; it was "
                "saved by a context without FSDP"
            )
        for j, (param, shard) in enumerate(zip(params, shards, strict=True)):
            local = local_shard(param)
            if shard is not None and (not isinstance(shard, torch.Tensor) or shard.shape != local.shape):
                what = getattr(shard, "shape", type(shard).__name__)
                raise ValueError(
                    f"optimizer {index}, parameter {j}: saved gradient shard {what}, this rank's shard is {local.shape}"
                )

    def load_windows(self, windows: list[Window], entries: list[WindowEntry]) -> None:
        """The unsynced sums back on the unsharded parameters (gathered for that), the shards' own on the shards."""
        units = gather_for_load(self.units) if any(entry["pending"] for entry in entries) else []
        try:
            unsynced = unsharded_by_param(self.units)
            for window, entry in zip(windows, entries, strict=True):
                with torch.no_grad():
                    for param, grad, shard in zip(window.params(), entry["grads"], entry["sharded_grads"], strict=True):
                        full = unsynced.get(id(param))
                        if full is not None:
                            full.grad = None if grad is None else grad.to(device=full.device, dtype=full.dtype).clone()
                        param.grad = None if shard is None else as_shard_of(param, shard)
        finally:
            for unit in units:
                unit.reshard()


def data_parallel(strategy: object) -> DataParallel:
    """The data parallelism of a new context: ``"ddp"`` (one process, or DDP) or ``"fsdp"`` (needs a process group)."""
    if strategy not in ("ddp", "fsdp"):
        raise ValueError(f"strategy must be 'ddp' or 'fsdp', got {strategy!r}")
    if strategy == "fsdp":
        if not (dist.is_available() and dist.is_initialized()):
            raise ValueError(
                "strategy='fsdp' shards the model over a process group: call torch.distributed.init_process_group "
                "before building the context"
            )
        return Sharded()
    return Replicated()


def local_shard(tensor: torch.Tensor) -> torch.Tensor:
    """The rank's own part of ``tensor``: its local shard when it is a ``DTensor``, else itself."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def as_shard_of(param: torch.Tensor, shard: torch.Tensor) -> torch.Tensor:
    """A gradient for the sharded ``param`` whose local part is ``shard``."""
    local = shard.to(device=param.device, dtype=param.dtype).clone()
    if not isinstance(param, DTensor):
        return local
    return DTensor.from_local(local, param.device_mesh, param.placements, shape=param.shape, stride=param.stride())
