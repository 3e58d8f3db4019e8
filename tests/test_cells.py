"""The cells of the matrix: which strategy a cell of several ranks has, and what a claim of strategies selects."""

from __future__ import annotations

from typing import Literal

import pytest

from lightning_optimizer.conformance.plugin import _verdict
from lightning_optimizer.conformance.selection import CellFilter, cells
from lightning_optimizer.spec import Cell, GradScalerSettings, TrainingContext, implementation_info
from lightning_optimizer.spec.types import DEVICE_KINDS, PRECISIONS, STRATEGIES, FailurePolicy


def test_a_cell_of_several_xla_devices_is_spmd_and_of_several_ranks_ddp() -> None:
    assert Cell("xla", "32-true", 2).strategy == "spmd"
    assert Cell("cpu", "32-true", 2).strategy == "ddp"
    assert Cell("cuda", "bf16-mixed", 2).strategy == "ddp"
    assert Cell("cpu", "32-true", 2, "fsdp").strategy == "fsdp"
    assert Cell("xla", "32-true", 1).strategy == "none"
    assert Cell("xla", "32-true", 2).id == "xla-32-true-ws2", "an SPMD cell keeps the id it had"


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_spmd_is_refused_off_xla(device: str) -> None:
    with pytest.raises(ValueError, match="'spmd' is XLA's"):
        Cell(device, "32-true", 2, "spmd")  # type: ignore[arg-type]


def test_the_matrix_has_spmd_cells_on_xla_only() -> None:
    every = cells(
        CellFilter(devices=DEVICE_KINDS, precisions=PRECISIONS, world_sizes=("1", "2"), strategies=STRATEGIES)
    )
    by_strategy = {(cell.device, cell.strategy) for cell in every if cell.world_size == 2}
    assert by_strategy == {("cpu", "ddp"), ("cpu", "fsdp"), ("cuda", "ddp"), ("cuda", "fsdp"), ("xla", "spmd")}


class _Item:
    """The part of a pytest item that the plugin's verdict reads: a check of every cell of world size 1 and 2."""

    def iter_markers(self, name: str) -> list[object]:
        return []

    def get_closest_marker(self, name: str) -> pytest.Mark | None:
        return pytest.mark.cells(world_sizes=(1, 2)).mark if name == "cells" else None


def _never_called(
    cell: Cell,
    *,
    accumulate_grad_batches: int = 1,
    gradient_clip_val: float | None = None,
    gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    grad_scaler: GradScalerSettings | None = None,
    on_failure: FailurePolicy = "discard",
    zero_grad_after_step: bool = True,
) -> TrainingContext:
    raise AssertionError("the claims are read without building a context")


def test_ddp_on_cpu_and_one_xla_device_is_claimed_without_spmd() -> None:
    """Claims are not a cross product: strategies none and ddp, devices cpu and xla, world sizes 1 and 2."""
    info = implementation_info(
        _never_called,
        name="claims",
        version="0",
        devices=("cpu", "xla"),
        world_sizes=(1, 2),
        strategies=("none", "ddp"),
    )
    assert _verdict(_Item(), info, Cell("cpu", "32-true", 2)) is None  # type: ignore[arg-type]
    not_claimed = _verdict(_Item(), info, Cell("xla", "32-true", 2))  # type: ignore[arg-type]
    assert not_claimed is not None and "strategy spmd" in str(not_claimed)
    one_device = _verdict(_Item(), info, Cell("xla", "32-true", 1))  # type: ignore[arg-type]
    assert one_device is None or "torch_xla" in str(one_device)
