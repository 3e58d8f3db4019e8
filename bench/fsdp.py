"""The FSDP case: accumulation over 4 micro-steps with two optimizers, on 2 gloo ranks, the models sharded by FSDP2.

Three loops train the same two models (``fully_shard`` on each ``Linear``, then on the model: the reference's
policy) on each rank's batch: the reference (closure form, ``accumulate_grad_batches=4``, ``strategy="fsdp"``),
plain PyTorch that calls ``set_requires_gradient_sync`` by hand (the raw baseline), and plain PyTorch that syncs
on every micro-step. FSDP2's reduce-scatters and all-gathers are counted on each rank (the suite's
``CollectiveCounter``).

The ranks are those of the conformance suite's rank pool, a fresh pool for every run, as in the DDP case.
"""

from __future__ import annotations

import resource
from collections.abc import Callable
from contextlib import ExitStack
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard

from bench.cases import mse
from bench.ddp import (
    ACCUMULATE,
    BATCH,
    WIDTH,
    WINDOWS,
    WORLD_SIZE,
    DdpRuns,
    build_model,
    build_optimizers,
    reference_loop,
    stdout_to_stderr,
    time_windows,
)
from bench.worker import RunResult
from lightning_optimizer.conformance.scenarios import CollectiveCounter
from lightning_optimizer.spec import Cell, ImplementationInfo

__all__ = ["ACCUMULATE", "CASE", "DESCRIPTION", "IMPLEMENTATIONS", "NOTES", "WINDOWS", "measure_fsdp", "train_windows"]

CASE = "fsdp-accumulate-4"
DESCRIPTION = (
    f"2 gloo ranks, 2 FSDP2-sharded models of 2 Linear({WIDTH}, {WIDTH}) with SGD and Adam, batch {BATCH} per rank, "
    f"windows of {ACCUMULATE} micro-steps"
)
IMPLEMENTATIONS = ("raw", "reference", "raw-sync-every-step")
NOTES = {
    "raw": "plain fully_shard, set_requires_gradient_sync(False) on the micro-steps that do not close a window",
    "reference": "closure form, accumulate_grad_batches=4, strategy='fsdp', make_optimizer_step=None",
    "raw-sync-every-step": "plain fully_shard, every backward reduce-scatters",
}


def _sharded(seed: int) -> torch.nn.Module:
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    module = build_model(seed)
    for layer in list(module.modules())[1:]:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(module, mesh=mesh)
    return module


def train_windows(
    info: ImplementationInfo[Any], cell: Cell, *, impl: str, windows: int, warmup: int, threads: int
) -> dict[str, Any]:
    """Run ``warmup`` untimed and ``windows`` timed windows of ``impl`` on this rank; return times and counts."""
    torch.set_num_threads(threads)
    generator = torch.Generator().manual_seed(10 + dist.get_rank())
    inputs, targets = torch.randn(BATCH, WIDTH, generator=generator), torch.randn(BATCH, WIDTH, generator=generator)
    models: list[Any]  # DistributedDataParallel or FSDP modules: their sync controls are called below
    if impl == "reference":
        models, micro_step = reference_loop(info, cell, inputs, targets)
    elif impl in ("raw", "raw-sync-every-step"):
        models = [_sharded(seed) for seed in (0, 1)]
        plain = build_optimizers(models)
        skip_sync = impl == "raw"

        def micro_step(batch_idx: int) -> None:
            closes = (batch_idx + 1) % ACCUMULATE == 0
            for module, optimizer in zip(models, plain, strict=True):
                if skip_sync:
                    module.set_requires_gradient_sync(closes)
                loss = mse(module(inputs), targets) / ACCUMULATE
                loss.backward()
                if closes:
                    optimizer.step()
                    optimizer.zero_grad()

    else:
        raise ValueError(f"unknown FSDP implementation {impl!r}; expected one of {', '.join(IMPLEMENTATIONS)}")
    for module in models:
        if not isinstance(module, FSDPModule):
            raise AssertionError(f"{impl}: the model is a {type(module).__name__}, not an FSDPModule")
    counter = CollectiveCounter()
    with ExitStack() as stack:
        window_ns = time_windows(micro_step, warmup, windows, after_warmup=lambda: stack.enter_context(counter))
    counts = counter.counts
    return {
        "window_ns": window_ns,
        "reduce_scatters": counts["reduce_scatter"],
        "all_gathers": counts["all_gather"],
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def measure_fsdp(
    runs: int, windows: int, warmup: int, threads: int, progress: Callable[[str], None] | None = None
) -> tuple[DdpRuns, dict[str, str]]:
    """Time the three loops, alternating, each run on a fresh pool of 2 gloo ranks; check the ranks' counts.

    Returns the runs and, per implementation, its collectives per window (the same on every rank).
    """
    from lightning_optimizer.conformance.ranks import RankPool

    cell = Cell("cpu", "32-true", WORLD_SIZE, "fsdp")
    result = DdpRuns(windows, {impl: [] for impl in IMPLEMENTATIONS})
    counts: dict[str, list[tuple[int, int]]] = {impl: [] for impl in IMPLEMENTATIONS}
    for index in range(runs):
        for impl in IMPLEMENTATIONS:
            pool = RankPool("lightning_optimizer.reference", "cpu", WORLD_SIZE, scenarios=__name__)
            try:
                with stdout_to_stderr():
                    ranks = pool.run("train_windows", cell, impl=impl, windows=windows, warmup=warmup, threads=threads)
            finally:
                pool.stop()
            run = RunResult(CASE, impl, step_ns=ranks[0]["window_ns"], peak_rss_kib=ranks[0]["peak_rss_kib"])
            result.runs[impl].append(run)
            counts[impl].extend((r["reduce_scatters"], r["all_gathers"]) for r in ranks)
            if progress is not None:
                progress(f"{CASE} run {index + 1}/{runs} {impl}")
    collectives = {}
    for impl, per_rank in counts.items():
        if len(set(per_rank)) != 1:
            raise RuntimeError(f"{impl}: the ranks counted different collectives: {sorted(set(per_rank))}")
        reduce_scatters, all_gathers = per_rank[0]
        collectives[impl] = (
            f"{reduce_scatters / windows:g} reduce-scatters, {all_gathers / windows:g} all-gathers per window"
        )
    return result, collectives
