"""What the process of an XLA cell with several devices runs: one process, SPMD, the batch sharded over the devices.

torch_xla's SPMD mode (``torch_xla.runtime.use_spmd()``) makes one process drive every device: the model stays
replicated, the suite shards each global batch over a one-axis mesh (``mark_sharding``, as a user's data loader
would), and XLA's partitioner puts the cross-device reduction of the gradients into the compiled graph. On XLA's
CPU backend ``CPU_NUM_DEVICES`` sets how many devices there are; real multi-chip TPU hosts give theirs.
:func:`start_spmd` runs in the process before anything else; XLA then dumps every compiled graph as text, which is
how a check sees that the graph is partitioned and holds the reduction.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from lightning_optimizer.conformance.harness import Batch, build_context, cell_device, cell_dtype
from lightning_optimizer.conformance.scenarios import (
    ACCUMULATE,
    LOSS_FACTOR,
    build_model,
    build_optimizer,
    global_batches,
    loss_backward,
    micro_step,
)
from lightning_optimizer.conformance.xla_epochs import xla_counts
from lightning_optimizer.spec import Cell, ImplementationInfo

__all__ = ["SpmdUnavailable", "start_spmd", "train_spmd_epoch"]

_DUMP = "LIGHTNING_OPTIMIZER_SPMD_DUMP"
"""Where this process's XLA dumps its compiled graphs (set by :func:`start_spmd`)."""


class SpmdUnavailable(RuntimeError):
    """torch_xla cannot drive the devices a cell needs here."""


def start_spmd(devices: int, dump: str) -> None:
    """Make this process drive ``devices`` XLA devices under SPMD (on the CPU backend: ``CPU_NUM_DEVICES``).

    XLA dumps the graphs it compiles into the folder ``dump`` (made if missing), which the caller owns and removes: a
    rank process is killed at the end of its pool, so it cannot remove it itself.
    """
    os.makedirs(dump, exist_ok=True)
    os.environ[_DUMP] = dump
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    if os.environ["PJRT_DEVICE"] == "CPU":
        os.environ["CPU_NUM_DEVICES"] = str(devices)
    flags = os.environ.get("XLA_FLAGS", "")
    os.environ["XLA_FLAGS"] = f"{flags} --xla_dump_to={dump} --xla_dump_hlo_as_text".strip()
    import torch_xla.runtime as xr

    xr.use_spmd()
    found = xr.global_runtime_device_count()
    if found != devices:
        raise SpmdUnavailable(f"torch_xla drives {found} devices under SPMD here, the cell needs {devices}")


def _compiled_graphs() -> list[tuple[int, int]]:
    """For each graph XLA compiled in this process: its partitions and its all-reduce operations.

    A graph compiled once is not compiled (nor dumped) again: an epoch whose graphs an earlier one compiled adds
    none, so the check reads every graph of the process (only SPMD scenarios run in it).
    """
    graphs = []
    for path in sorted(Path(os.environ[_DUMP]).glob("*after_optimizations.txt")):
        text = path.read_text(encoding="utf-8")
        partitions = re.search(r"num_partitions=(\d+)", text)
        graphs.append(
            (int(partitions.group(1)) if partitions else 1, len(re.findall(r" all-reduce(?:-start)?\(", text)))
        )
    return graphs


def train_spmd_epoch(
    info: ImplementationInfo[Any],
    cell: Cell,
    *,
    form: str,
    modules: Sequence[str],
    make_optimizer_step: Sequence[Sequence[bool | None]],
    sync_at: Sequence[Sequence[int]],
    plain_backward: Sequence[bool],
) -> dict[str, Any]:
    """One epoch of the global batches, each sharded over the cell's devices, one wrapper per prepared module.

    The forms and arguments are those of :func:`.scenarios.train_epoch_on_shards`. Returns, per batch, every
    module's parameters after it and every wrapper's ``last_outcome`` after each module's call, the graph cuts
    (``MarkStep``) the batch ran, and each graph compiled in the process so far: its partitions and all-reduces.
    """
    import importlib

    import numpy as np
    import torch_xla.runtime as xr

    xs: Any = importlib.import_module("torch_xla.distributed.spmd")

    devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(devices), (devices,), ("data",))
    context = build_context(info.factory, cell, accumulate_grad_batches=ACCUMULATE)
    prepared = [context.prepare_module(build_model(name)) for name in modules]
    wrappers = [
        context.wrap(build_optimizer(name, model.parameters())) for name, model in zip(modules, prepared, strict=True)
    ]
    device, dtype = cell_device(cell), cell_dtype(cell)
    batches = global_batches(cell.world_size)
    params: list[list[list[torch.Tensor]]] = []
    outcomes: list[list[list[Any]]] = []
    cuts: list[int] = []
    for batch_idx, batch in enumerate(batches):
        x, y = (tensor.to(device=device, dtype=dtype) for tensor in batch)
        for tensor in (x, y):
            xs.mark_sharding(tensor, mesh, ("data", None))
        outcomes.append([])
        before = xla_counts()["cuts"]
        with context.batch(batch_idx, is_last=batch_idx == len(batches) - 1):
            for j, (model, wrapper) in enumerate(zip(prepared, wrappers, strict=True)):
                backward: Callable[[torch.Tensor], None] = loss_backward if plain_backward[j] else wrapper.backward

                def loss_of(model: torch.nn.Module = model, sharded: Batch = (x, y)) -> torch.Tensor:
                    with context.autocast():
                        return torch.nn.functional.mse_loss(model(sharded[0]).to(dtype), sharded[1]) * LOSS_FACTOR

                micro_step(wrapper, form, loss_of, backward, make_optimizer_step[j][batch_idx], batch_idx in sync_at[j])
                outcomes[-1].append([w.last_outcome for w in wrappers])
        cuts.append(xla_counts()["cuts"] - before)
        params.append([[p.detach().cpu().clone() for p in model.parameters()] for model in prepared])
    return {"params": params, "outcomes": outcomes, "cuts": cuts, "graphs": _compiled_graphs()}
