"""What the data-parallel checks (DDP, FSDP, XLA, SPMD) share: their epoch's run, sync and rank checks, the oracle.

:func:`run_plans` runs the DDP and SPMD epoch of :mod:`.data_parallel`; :func:`assert_synced_ranks` checks what the
ranks of DDP and FSDP report; :func:`plain_epoch` is the plain PyTorch loop of several optimizers over an epoch, on
which the FSDP and XLA oracles are built.
"""

from __future__ import annotations

from collections.abc import Callable, Container, Mapping, Sequence
from typing import Any

import torch
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.conformance.assertions import param_values
from lightning_optimizer.conformance.data_parallel import Plan
from lightning_optimizer.conformance.harness import LOSS_FACTOR, Batch, oracle_step_done
from lightning_optimizer.conformance.plain_loop import (
    ClipFunction,
    PrepareHook,
    oracle_loss,
    real_step,
    scaled_backward,
    update_scaler,
)
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.spec import Cell, StepOutcome

__all__ = [
    "FORMS",
    "Calls",
    "Params",
    "assert_one_sync_per_window",
    "assert_synced_ranks",
    "first_difference",
    "plain_epoch",
    "run_plans",
]

FORMS = {"closure": "closure form", "toggle": "toggle_model block, then step()"}
"""The call forms of a micro-step (a scenario's ``form``), as messages name them."""
Params = list[list[list[torch.Tensor]]]
"""Every module's parameters after every batch: ``params[batch][module]``."""


def run_plans(ranks: RankPool, scenario: str, cell: Cell, form: str, plans: Sequence[Plan]) -> list[dict[str, Any]]:
    """Every rank's result of ``scenario`` (``train_epoch_on_shards`` or ``train_spmd_epoch``) run on ``plans``.

    Outside 16-mixed (where the wrapper scales) the second module's closure calls ``loss.backward()`` itself.
    """
    return ranks.run(
        scenario,
        cell,
        form=form,
        modules=[plan.module for plan in plans],
        make_optimizer_step=[list(plan.make_optimizer_step) for plan in plans],
        sync_at=[sorted(plan.closing) for plan in plans],
        plain_backward=[j > 0 and cell.precision != "16-mixed" for j in range(len(plans))],
    )


def assert_one_sync_per_window(
    by_batch: Mapping[int, int], windows: Sequence[Sequence[int]], what: str, rule: str
) -> None:
    """``by_batch`` (batch: reducing operations, batches without any left out): the same in each closing batch only."""
    closing = sorted(window[-1] for window in windows)
    shown = ", ".join("{" + ", ".join(map(str, window)) + "}" for window in windows)
    assert sorted(by_batch) == closing, (
        f"{what}: reductions by batch {dict(by_batch)}, expected in each batch that closes a window of its optimizer "
        f"and only there, {closing} (windows {shown}); {rule}"
    )
    assert len(set(by_batch.values())) == 1, (
        f"{what}: reductions by batch {dict(by_batch)}: each window of one module costs the same sync; {rule}"
    )


def first_difference(run: Params, other: Params) -> tuple[int, int] | None:
    """The first ``(batch, module)`` whose parameters differ, bit for bit, between two runs; ``None`` if none does.

    Compares the batches both runs have (``zip`` of the shorter).
    """
    for batch_idx, (modules, others) in enumerate(zip(run, other, strict=False)):
        for j, (params, theirs) in enumerate(zip(modules, others, strict=True)):
            if not all(torch.equal(a, b) for a, b in zip(params, theirs, strict=True)):
                return batch_idx, j
    return None


def assert_synced_ranks(
    results: Sequence[dict[str, Any]],
    windows: Mapping[str, Sequence[Sequence[int]]],
    syncs: Sequence[Sequence[Mapping[int, int]]],
    what: str,
    rule: str,
) -> None:
    """On every rank each module syncs once per window, and holds rank 0's parameters after every batch [DDP-002].

    ``windows`` maps each module (in order) to its windows; ``syncs[rank][module]`` gives the rank's reducing
    operations by batch (:func:`assert_one_sync_per_window`, whose ``rule`` it is); ``results[rank]["params"]`` the
    parameters after every batch.
    """
    modules = list(windows)
    for rank, (result, synced) in enumerate(zip(results, syncs, strict=True)):
        for module, by_batch in zip(modules, synced, strict=True):
            assert_one_sync_per_window(by_batch, windows[module], f"{what}, module {module!r}, rank {rank}", rule)
        differs = first_difference(results[0]["params"], result["params"])
        assert differs is None, (
            f"{what}: module {modules[differs[1]]!r}'s parameters differ between rank 0 and rank {rank} after batch "
            f"{differs[0]}; after every real step the ranks must hold identical parameters [DDP-002, FSDP-003]"
        )


Calls = Sequence[Sequence[tuple[int, int | None]]]
"""Per batch, each call in order: ``(j, length)``, a micro-step of model ``j`` that closes a window of ``length``
micro-steps, or accumulates (``None``)."""


def plain_epoch(
    cell: Cell,
    optimizers: Sequence[tuple[torch.nn.Module, torch.optim.Optimizer]],
    batches: Sequence[Batch],
    calls: Calls,
    scaler: GradScaler | None,
    *,
    accumulate: int = 1,
    factor: float = LOSS_FACTOR,
    reduce: PrepareHook | None = None,
    clip: ClipFunction | None = None,
    blow_up: Container[tuple[int, int]] = (),
    before_forward: Callable[[int, int], object] | None = None,
) -> tuple[Params, list[list[StepOutcome]]]:
    """Plain PyTorch, one bare optimizer per model: each model's parameters after every batch, and its outcome.

    Each call of :data:`Calls` is a micro-step (its loss infinite where ``(batch, j)`` is in ``blow_up``;
    ``before_forward(batch, j)`` runs first); one that closes a window takes :func:`.plain_loop.real_step`
    (``reduce``, ``clip``) and a graph cut. The scaler is updated once per batch in which a window closed, the open
    windows brought to the new scale [AMP-006]. A model without a call in a batch reports ``ACCUMULATED``.
    """
    params: Params = []
    outcomes: list[list[StepOutcome]] = []
    every_param = [param for model, _ in optimizers for param in model.parameters()]
    for batch_idx, batch in enumerate(batches):
        outcomes.append([StepOutcome.ACCUMULATED] * len(optimizers))
        for j, length in calls[batch_idx]:
            model, optimizer = optimizers[j]
            if before_forward is not None:
                before_forward(batch_idx, j)
            scaled_backward(oracle_loss(model, batch, cell, (batch_idx, j) in blow_up, factor), scaler, accumulate)
            if length is not None:
                finite = real_step(
                    optimizer, length, scaler, accumulate, reduce=reduce, clip=clip, check_finite=scaler is not None
                )
                oracle_step_done(cell)
                outcomes[-1][j] = StepOutcome.STEPPED if finite else StepOutcome.SKIPPED_NON_FINITE
        if any(length is not None for _, length in calls[batch_idx]):
            update_scaler(scaler, every_param)
        params.append([param_values(model.parameters(), to_cpu=True) for model, _ in optimizers])
    return params, outcomes
