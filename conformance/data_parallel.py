"""The data-parallel epoch that the DDP and the XLA SPMD checks share: plans worked out by hand, the oracle.

Seven batches with ``accumulate_grad_batches=3``; each plan gives one prepared module's ``make_optimizer_step`` per
batch and the windows that the rule makes of them. The oracle is plain PyTorch on the global batch (every rank's
shard, or every device's), so it is the same whether ranks or devices share the batch.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, assert_params_close, oracle_scaler
from lightning_optimizer.conformance.oracles import oracle_copy
from lightning_optimizer.conformance.plain_loop import oracle_loss, real_step, scaled_backward, update_scaler
from lightning_optimizer.conformance.scenarios import EPOCH, build_model, build_optimizer, global_batches
from lightning_optimizer.spec import Cell, StepOutcome

__all__ = [
    "EVERY_SECOND_BATCH",
    "SCHEDULE_CUT_SHORT_KEPT_OPEN",
    "Plan",
    "assert_epoch",
    "expected_outcomes",
    "load",
    "oracle",
]

A, S = StepOutcome.ACCUMULATED, StepOutcome.STEPPED


@dataclass(frozen=True)
class Plan:
    """One prepared module's part of the epoch: its ``make_optimizer_step`` per batch and its windows."""

    module: str
    make_optimizer_step: tuple[bool | None, ...]
    windows: tuple[tuple[int, ...], ...]
    """Worked out by hand from the rule (accumulate_grad_batches=3, the last batch flushes)."""

    @property
    def closing(self) -> dict[int, int]:
        """The batch that closes each window, and the window's length."""
        return {window[-1]: len(window) for window in self.windows}


SCHEDULE_CUT_SHORT_KEPT_OPEN = Plan(
    "a",
    (None, None, None, None, True, False, None),
    # {0, 1, 2}: the schedule closes it at batch 2; {3, 4}: True cuts it short; False at batch 5 keeps it open
    # where the schedule would close it, and the last batch (is_last) flushes the partial {5, 6}.
    ((0, 1, 2), (3, 4), (5, 6)),
)
EVERY_SECOND_BATCH = Plan(
    "b",
    (False, True, False, True, False, True, None),
    # True/False every second batch ({0, 1}, {2, 3}, {4, 5}: False at batch 2 keeps the window open where the
    # schedule would close); the last batch, left to the schedule, flushes a window of one micro-step {6}.
    ((0, 1), (2, 3), (4, 5), (6,)),
)
assert all(len(plan.make_optimizer_step) == EPOCH for plan in (SCHEDULE_CUT_SHORT_KEPT_OPEN, EVERY_SECOND_BATCH))


def oracle(cell: Cell, plans: Sequence[Plan]) -> list[list[torch.nn.Module]]:
    """Plain PyTorch on the global batch: each module a bare SGD, stepped on its windows' mean; copies per batch.

    Under 16-mixed one plain ``GradScaler`` scales every loss, each optimizer is unscaled and stepped at the end
    of its window, and the scaler is updated once per batch in which an optimizer stepped.
    """
    models = [oracle_copy(build_model(plan.module), cell) for plan in plans]
    optimizers = [build_optimizer(plan.module, model.parameters()) for plan, model in zip(plans, models, strict=True)]
    scaler = oracle_scaler(cell)
    after: list[list[torch.nn.Module]] = []
    for batch_idx, batch in enumerate(global_batches(cell.world_size)):
        stepped = False
        for plan, model, optimizer in zip(plans, models, optimizers, strict=True):
            scaled_backward(oracle_loss(model, batch, cell), scaler)
            length = plan.closing.get(batch_idx)
            if length is None:
                continue
            finite = real_step(optimizer, length, scaler, check_finite=scaler is not None)
            assert finite, f"the check's own oracle overflowed at batch {batch_idx}: its losses are too large"
            stepped = True
        if stepped:
            update_scaler(scaler)
        after.append([copy.deepcopy(model) for model in models])
    return after


def expected_outcomes(plans: Sequence[Plan], batch_idx: int, called: int) -> list[StepOutcome | None]:
    """Every wrapper's ``last_outcome`` after module ``called``'s call in batch ``batch_idx``."""
    expected: list[StepOutcome | None] = []
    for j, plan in enumerate(plans):
        last = batch_idx if j <= called else batch_idx - 1
        expected.append(None if last < 0 else S if last in plan.closing else A)
    return expected


def load(cell: Cell, module: str, values: list[torch.Tensor]) -> torch.nn.Module:
    """Module ``module`` in the cell's dtype and device, holding ``values`` (a scenario's parameters)."""
    model = oracle_copy(build_model(module), cell)
    with torch.no_grad():
        for param, value in zip(model.parameters(), values, strict=True):
            param.copy_(value)
    return model


def assert_epoch(cell: Cell, plans: Sequence[Plan], result: dict[str, Any], label: str, run: str) -> None:
    """After every batch of ``result`` (a run of the epoch): the outcomes the plans give, the oracle's parameters.

    ``result["outcomes"][batch_idx][j]`` are the wrappers' ``last_outcome`` after module ``j``'s call [STEP-004];
    ``result["params"][batch_idx][j]`` module ``j``'s parameters, within the reordered tolerance of the plain loop
    on the global batch. ``run`` says what ran the epoch, with its requirement (``"DDP [DDP-002]"``).
    """
    windows = "; ".join(f"module {plan.module!r} {list(plan.windows)}" for plan in plans)
    for batch_idx in range(EPOCH):
        for j, plan in enumerate(plans):
            got, want = result["outcomes"][batch_idx][j], expected_outcomes(plans, batch_idx, j)
            assert got == want, (
                f"{label}: after module {plan.module!r}'s step() in batch {batch_idx} the wrappers' last_outcome "
                f"are {got}, expected {want} (windows {windows}) [STEP-004]"
            )
    # The epoch ran in the rank processes and its parameters came back as CPU tensors: the oracle on the global
    # batch runs on the CPU, in the cell's precision, so that this process compiles no XLA graph of its own.
    on_cpu = dataclasses.replace(cell, device="cpu", strategy="none")
    after = oracle(on_cpu, plans)
    for batch_idx in range(EPOCH):
        for j, plan in enumerate(plans):
            assert_params_close(
                load(on_cpu, plan.module, result["params"][batch_idx][j]),
                after[batch_idx][j],
                cell,
                f"{label}, module {plan.module!r}, after batch {batch_idx} (windows {list(plan.windows)}): {run} vs "
                "one process on the global batch",
                REORDERED_TOLERANCES[cell.precision],
            )
