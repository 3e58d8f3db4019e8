"""Checks of XLA cells with several devices: SPMD in one process, the batch sharded, the reduction in the graph.

Each check runs the DDP checks' epoch (seven batches, ``accumulate_grad_batches=3``, the plans of
:mod:`.data_parallel`) in one process that drives the cell's devices under SPMD (:mod:`.spmd`): each global batch
is sharded over the devices, as a user's data loader shards it, and XLA's partitioner reduces the gradients across
devices inside the compiled graph. After every batch the parameters are compared with the plain PyTorch loop on the
global batch; the graph cuts (torch_xla's ``MarkStep`` counter) must be one per real step and none in a micro-step
that only accumulates, so that a window executes as one graph; and every graph XLA compiled must be partitioned over
the devices, the steps' graphs holding the cross-device reduction (XLA-002).

XLA's CPU backend does not merge the reductions of a window's micro-steps (its pipeline does not reassociate
all-reduces), so the number of all-reduce operations in a window's graph is not checked; one graph per window is.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from lightning_optimizer.conformance.data_parallel import EVERY_SECOND_BATCH, SCHEDULE_CUT_SHORT_KEPT_OPEN, Plan
from lightning_optimizer.conformance.epoch_checks import FORMS, assert_one_cut_per_real_step, check_epoch
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.spec import Cell

SPMD_PRECISIONS = ("32-true",)
"""Each precision's window graphs compile anew under SPMD, 6 to 50 s an epoch on 2 CPU devices (16-mixed the most:
the scaler's reads add graphs), so the suite runs SPMD in 32-true; the precisions are checked on one XLA device,
and the other SPMD cells pass too (measured: 64-true, 16-mixed, bf16-mixed, bf16-true)."""


def _check_epoch(ranks: RankPool, cell: Cell, form: str, plans: Sequence[Plan]) -> None:
    """:func:`.epoch_checks.check_epoch` under SPMD, then one graph cut per real step, each graph partitioned."""
    (result,) = check_epoch(
        ranks, cell, form, plans, "train_spmd_epoch", f"SPMD over {cell.world_size} devices [XLA-002]"
    )
    label = FORMS[form]
    assert_one_cut_per_real_step(result["cuts"], plans, label, "XLA-002")
    graphs = result["graphs"]
    assert graphs, f"{label}: XLA compiled no graph in the process; the run cannot have executed on the devices"
    assert all(partitions == cell.world_size for partitions, _ in graphs), (
        f"{label}: compiled graphs (partitions, all-reduces) {graphs}: each must be partitioned over the "
        f"{cell.world_size} devices (the batch is sharded over them) [XLA-002]"
    )
    assert any(reduces for _, reduces in graphs), (
        f"{label}: no compiled graph holds an all-reduce ({graphs}): the gradients of the sharded batch must be "
        "reduced across the devices inside the graph [XLA-002]"
    )


WINDOWS = ("k >= 2 micro-steps", "cut short by True", "partial, flushed by the last batch")


@pytest.mark.requirement("XLA-002", "STEP-004")
@pytest.mark.cells(devices=("xla",), precisions=SPMD_PRECISIONS, world_sizes=(2,))
@pytest.mark.varies(
    window=(*WINDOWS, "1 micro-step", "open while another optimizer steps"),
    make_optimizer_step=("True", "False", "None"),
    call_form=("closure, wrapper.backward", "closure, loss.backward"),
    modules=("2 prepared modules",),
    wrappers=("2",),
    outcome_read=("after every call of every wrapper",),
    reduction=("result", "graph cuts per window"),
    position=("inside batch()",),
    optimizer=("SGD", "SGD momentum"),
)
def test_spmd_window_is_one_graph(ranks: RankPool, cell: Cell) -> None:
    """Two modules with their own cadences, the batch sharded: one graph cut per real step, the global result."""
    _check_epoch(ranks, cell, "closure", (SCHEDULE_CUT_SHORT_KEPT_OPEN, EVERY_SECOND_BATCH))


@pytest.mark.requirement("XLA-002", "TOGGLE-003")
@pytest.mark.cells(devices=("xla",), precisions=SPMD_PRECISIONS, world_sizes=(2,))
@pytest.mark.varies(
    window=(*WINDOWS, "1 micro-step", "open while another optimizer steps"),
    make_optimizer_step=("True", "False", "None"),
    call_form=("toggle_model block, then step()",),
    modules=("2 prepared modules",),
    wrappers=("2",),
    reduction=("result", "graph cuts per window"),
    position=("inside batch()",),
    optimizer=("SGD", "SGD momentum"),
)
def test_spmd_toggle_model_form(ranks: RankPool, cell: Cell) -> None:
    """The ``toggle_model`` form of the same epoch, in one precision."""
    _check_epoch(ranks, cell, "toggle", (SCHEDULE_CUT_SHORT_KEPT_OPEN, EVERY_SECOND_BATCH))
