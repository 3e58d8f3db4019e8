"""Scenarios for the rank pool's own tests: a rank that raises, dies or hangs."""

from __future__ import annotations

import os
import time
from typing import Any

import torch.distributed as dist

from lightning_optimizer.spec import Cell, ImplementationInfo


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


def hangs_on_rank_1(info: ImplementationInfo[Any], cell: Cell) -> None:
    if dist.get_rank() == 1:
        time.sleep(600)
    dist.barrier()
