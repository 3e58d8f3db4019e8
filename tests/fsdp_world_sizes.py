"""A sharded checkpoint taken on 2 gloo ranks, resumed on 1 (``tests/test_fsdp.py`` runs both halves).

``python fsdp_world_sizes.py save DIR``: two ranks train two windows of 3 micro-steps (and one micro-step more,
for a second checkpoint with a window open), saving after the second window: the model and optimizer through
``torch.distributed.checkpoint``, each rank's context state. ``python fsdp_world_sizes.py load DIR``: one rank
loads them and trains the third window on the whole global batch, then prints its parameters' distance to a plain
single-process loop of all three windows, and whether the open-window state was refused.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load
from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

from lightning_optimizer.reference import TrainingContext

ACCUMULATE, WINDOWS = 3, 3


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 7), torch.nn.Tanh(), torch.nn.Linear(7, 2))


def _batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [(torch.randn(8, 4, generator=generator), torch.randn(8, 2, generator=generator)) for _ in range(10)]


def _group(rank: int, world_size: int, port: int) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _train(world_size: int, rank: int, start: int, stop: int, model: torch.nn.Module, opt: object, ctx: object) -> None:
    half = 8 // world_size
    for index in range(start, stop):
        x, y = _batches()[index]
        x, y = x[rank * half : (rank + 1) * half], y[rank * half : (rank + 1) * half]

        def closure(x: torch.Tensor = x, y: torch.Tensor = y) -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(model(x), y)
            opt.backward(loss)  # type: ignore[attr-defined]
            return loss

        opt.step(closure)  # type: ignore[attr-defined]


def _build() -> tuple[TrainingContext, torch.nn.Module, object]:
    ctx = TrainingContext(accumulate_grad_batches=ACCUMULATE, strategy="fsdp")
    model = ctx.prepare_module(_model())
    opt = ctx.wrap(torch.optim.AdamW(model.parameters(), lr=1e-2))
    return ctx, model, opt


def _save_rank(rank: int, port: int, folder: str) -> None:
    _group(rank, 2, port)
    ctx, model, opt = _build()
    _train(2, rank, 0, 2 * ACCUMULATE, model, opt, ctx)
    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, opt.optimizer),  # type: ignore[attr-defined]
    }
    dcp_save(state, checkpoint_id=f"{folder}/sharded")
    torch.save(ctx.state_dict(), f"{folder}/context-rank{rank}.pt")
    _train(2, rank, 2 * ACCUMULATE, 2 * ACCUMULATE + 1, model, opt, ctx)
    torch.save(ctx.state_dict(), f"{folder}/open-context-rank{rank}.pt")
    dist.destroy_process_group()


def _load(folder: str) -> None:
    _group(0, 1, _free_port())
    ctx, model, opt = _build()
    refused = "not refused"
    try:
        ctx.load_state_dict(torch.load(f"{folder}/open-context-rank0.pt", weights_only=False))
    except ValueError as error:
        refused = "refused" if "world size 2" in str(error) else f"refused for another reason: {error}"
    state: dict[str, Any] = {
        "model": get_model_state_dict(model),
        "optim": get_optimizer_state_dict(model, opt.optimizer),  # type: ignore[attr-defined]
    }
    dcp_load(state, checkpoint_id=f"{folder}/sharded")
    set_model_state_dict(model, state["model"])
    set_optimizer_state_dict(model, opt.optimizer, state["optim"])  # type: ignore[attr-defined]
    ctx.load_state_dict(torch.load(f"{folder}/context-rank0.pt", weights_only=False))
    _train(1, 0, 2 * ACCUMULATE, WINDOWS * ACCUMULATE, model, opt, ctx)
    plain = _model()
    plain_opt = torch.optim.AdamW(plain.parameters(), lr=1e-2)
    for index, (x, y) in enumerate(_batches()[: WINDOWS * ACCUMULATE]):
        (torch.nn.functional.mse_loss(plain(x), y) / ACCUMULATE).backward()
        if (index + 1) % ACCUMULATE == 0:
            plain_opt.step()
            plain_opt.zero_grad()
    distance = max(
        (p.full_tensor() - q).abs().max().item()  # type: ignore[attr-defined]
        for p, q in zip(model.parameters(), plain.parameters(), strict=True)
    )
    print(f"distance {distance:.3g}; open window from world size 2: {refused}")
    dist.destroy_process_group()


if __name__ == "__main__":
    what, folder = sys.argv[1], sys.argv[2]
    Path(folder).mkdir(parents=True, exist_ok=True)
    if what == "save":
        from torch.multiprocessing.spawn import start_processes as untyped_start_processes

        start_processes: Any = untyped_start_processes
        # Forked, not spawned: this process has imported torch and run nothing yet, so each rank skips that import.
        start_processes(_save_rank, args=(_free_port(), folder), nprocs=2, join=True, start_method="fork")
    else:
        _load(folder)
