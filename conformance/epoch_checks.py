"""What the data-parallel checks (DDP, FSDP, XLA, SPMD) check of their epochs: syncs, graph cuts, ranks, the oracle.

:func:`check_epoch` runs the DDP and SPMD epoch of :mod:`.data_parallel` (:func:`run_plans`); :func:`assert_epoch`
checks every rank's run of an epoch (DDP, FSDP, SPMD) against the global-batch oracle, with the syncs per window
where a rule is given (:func:`assert_synced_ranks`); :func:`assert_one_cut_per_real_step` checks XLA's graph cuts.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from lightning_optimizer.conformance.data_parallel import Params, Plan, load, oracle
from lightning_optimizer.conformance.harness import REORDERED_TOLERANCES, Tolerance, assert_params_close
from lightning_optimizer.conformance.plain_loop import ClipFunction, unscaled_finite
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.spec import Cell

__all__ = [
    "FORMS",
    "assert_epoch",
    "assert_one_cut_per_real_step",
    "assert_one_sync_per_window",
    "assert_params",
    "assert_synced_ranks",
    "check_epoch",
    "counted_clipper",
    "first_difference",
    "run_plans",
]

FORMS = {"closure": "closure form", "toggle": "toggle_model block, then step()"}
"""The call forms of a micro-step (a scenario's ``form``), as messages name them."""


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


def check_epoch(
    ranks: RankPool,
    cell: Cell,
    form: str,
    plans: Sequence[Plan],
    scenario: str,
    run: str,
    *,
    rule: str = "",
) -> list[dict[str, Any]]:
    """:func:`run_plans` of ``scenario``, then :func:`assert_epoch` of its results (``rule``: syncs per window)."""
    results = run_plans(ranks, scenario, cell, form, plans)
    assert_epoch(cell, plans, results, form, run, rule=rule)
    return results


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


def assert_one_cut_per_real_step(cuts: Sequence[int], plans: Sequence[Plan], what: str, requirement: str) -> None:
    """XLA: each batch cuts the graph once per real step of the plans (a skipped one included), and never otherwise."""
    want = [sum(batch_idx in plan.closing for plan in plans) for batch_idx in range(len(cuts))]
    assert list(cuts) == want, (
        f"{what}: graph cuts (torch_xla.sync / xm.mark_step) per batch {list(cuts)}, expected {want} (windows "
        f"{[list(plan.windows) for plan in plans]}): one per real step, after its inner step, and none in a "
        f"micro-step that only accumulates, so that a window executes as one graph [{requirement}]"
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


def assert_synced_ranks(results: Sequence[dict[str, Any]], plans: Sequence[Plan], what: str, rule: str) -> None:
    """On every rank each module syncs once per window, and holds rank 0's parameters after every batch [DDP-002].

    ``results[rank]["reduces"][module]`` gives the rank's reducing operations as ``(batch, count)``
    (:func:`assert_one_sync_per_window`, whose ``rule`` it is); ``results[rank]["params"]`` the parameters after
    every batch.
    """
    for rank, result in enumerate(results):
        for plan, by_batch in zip(plans, result["reduces"], strict=True):
            where = f"{what}, module {plan.module!r}, rank {rank}"
            assert_one_sync_per_window(dict(by_batch), plan.windows, where, rule)
        differs = first_difference(results[0]["params"], result["params"])
        assert differs is None, (
            f"{what}: module {plans[differs[1]].module!r}'s parameters differ between rank 0 and rank {rank} after "
            f"batch {differs[0]}; after every real step the ranks must hold identical parameters [DDP-002, FSDP-003]"
        )


def counted_clipper(norm: float) -> tuple[ClipFunction, list[bool]]:
    """``clip_grad_norm_`` at ``norm`` of a real step's finite gradients, and a list of whether each one clipped."""
    clipped: list[bool] = []

    def clip(params: list[torch.Tensor]) -> None:
        if unscaled_finite(params):
            clipped.append(float(torch.nn.utils.clip_grad_norm_(params, norm)) > norm)

    return clip, clipped


def assert_epoch(
    cell: Cell,
    plans: Sequence[Plan],
    results: Sequence[dict[str, Any]],
    form: str,
    run: str,
    *,
    rule: str = "",
    **options: Any,
) -> None:
    """Every rank's run of the epoch (``results``) against the plain loop on the global batch (:func:`.oracle`).

    Where a ``rule`` is given each module syncs once per window on every rank (:func:`assert_synced_ranks`);
    ``result["outcomes"][batch_idx][j]`` are the wrappers' ``last_outcome`` after module ``j``'s call, the oracle's
    [STEP-004]; rank 0's ``result["params"][batch_idx][j]`` module ``j``'s parameters, within the reordered tolerance
    of the oracle's. ``run`` says what ran the epoch, with its requirement (``"DDP [DDP-002]"``); the other
    ``options`` go to the oracle (``blow_up``: the non-finite gradients the run planted).
    """
    label = FORMS[form]
    if rule:
        assert_synced_ranks(results, plans, label, rule)
    # The epoch ran in the rank processes and its parameters came back as CPU tensors: the oracle on the global
    # batch runs on the CPU, in the cell's precision, so that this process compiles no XLA graph of its own.
    want, outcomes = oracle(dataclasses.replace(cell, device="cpu", strategy="none"), plans, **options)
    blow_up = options.get("blow_up", ())
    shown = "; ".join(f"module {plan.module!r} {list(plan.windows)}" for plan in plans)
    shown += f"; non-finite gradients planted at (batch, module) {sorted(blow_up)}" if blow_up else ""
    for rank, result in enumerate(results):
        for batch_idx, after_calls in enumerate(result["outcomes"]):
            for called, got in enumerate(after_calls):
                before = outcomes[batch_idx - 1] if batch_idx else [None] * len(plans)
                expected = [*outcomes[batch_idx][: called + 1], *before[called + 1 :]]
                assert got == expected, (
                    f"{label}, rank {rank}, {run}: after module {plans[called].module!r}'s step() in batch "
                    f"{batch_idx} the wrappers' last_outcome are {got}, expected {expected} (windows {shown}): each "
                    "window steps at its closing call, skipped on every rank if a gradient is not finite [STEP-004]"
                )
    what = f"{run} vs one process on the global batch, {label}"
    assert_params(cell, plans, dict(enumerate(results[0]["params"])), want, what, REORDERED_TOLERANCES[cell.precision])


def assert_params(
    cell: Cell,
    plans: Sequence[Plan],
    got: Mapping[int, Sequence[list[torch.Tensor]]],
    want: Params,
    what: str,
    tolerance: Tolerance | None = None,
    hint: Callable[[int, list[torch.Tensor]], str] | None = None,
) -> None:
    """After each batch of ``got`` (``got[batch][module]``, CPU tensors) each module's parameters are the oracle's.

    Within ``tolerance`` (the cell's by default); ``hint(batch, values)`` may add a diagnosis to the message.
    """
    on_cpu = dataclasses.replace(cell, device="cpu", strategy="none")
    for batch_idx, modules in got.items():
        for j, plan in enumerate(plans):
            where = f"{what}, module {plan.module!r}, after batch {batch_idx} (windows {list(plan.windows)})"
            try:
                expected = load(on_cpu, plan.module, want[batch_idx][j])
                assert_params_close(load(on_cpu, plan.module, modules[j]), expected, cell, where, tolerance)
            except AssertionError as error:
                raise AssertionError(f"{error}{hint(batch_idx, modules[j]) if hint else ''}") from None
