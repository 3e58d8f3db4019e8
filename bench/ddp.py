"""The DDP case: accumulation over 4 micro-steps with two optimizers, on 2 gloo ranks of a real process group.

Three loops train the same two models (one per optimizer, each in ``DistributedDataParallel``) on each rank's
batch: the reference (closure form, ``accumulate_grad_batches=4``: micro-steps that do not close a window run
under ``no_sync`` by themselves), plain PyTorch that enters ``no_sync()`` by hand (the raw baseline), and plain
PyTorch that syncs on every micro-step. A DDP communication hook counts the gradient all-reduces (one per
bucket) and the sync rounds (backward passes that reduced) before doing DDP's default all-reduce.

The ranks are those of the conformance suite's rank pool, a fresh pool (fresh processes) for every run of
every implementation, as in the other cases; :func:`train_windows` builds the models, runs untimed warm-up
windows, then times each window on the rank and reports the rank's peak resident memory.
"""

# No ``from __future__ import annotations`` here: DDP checks a communication hook's annotations at run time.
import os
import resource
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import GradBucket
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

from bench.cases import LEARNING_RATE, mse
from bench.worker import RunResult
from lightning_optimizer.spec import Cell, ImplementationInfo

ACCUMULATE = 4
WINDOWS = 8
"""Timed windows per run by default."""
WORLD_SIZE = 2
WIDTH, BATCH = 512, 16
CASE = "ddp-accumulate-4"
DESCRIPTION = (
    f"2 gloo ranks, 2 models of 2 Linear({WIDTH}, {WIDTH}) with SGD and Adam, batch {BATCH} per rank, "
    f"windows of {ACCUMULATE} micro-steps"
)
IMPLEMENTATIONS = ("raw", "reference", "raw-sync-every-step")
"""``raw`` enters ``no_sync()`` by hand; ``raw-sync-every-step`` lets DDP reduce on every micro-step."""
NOTES = {
    "raw": "plain DDP, no_sync() on the micro-steps that do not close a window, loss / 4",
    "reference": "closure form, accumulate_grad_batches=4, make_optimizer_step=None",
    "raw-sync-every-step": "plain DDP without no_sync: every backward all-reduces",
}


class _Counter:
    """State of :func:`_counting_allreduce`."""

    def __init__(self) -> None:
        self.allreduces = 0
        self.rounds = 0


def _counting_allreduce(state: _Counter, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """A DDP communication hook: count the bucket (and the round, at its last bucket), then all-reduce it."""
    state.allreduces += 1
    if bucket.is_last():
        state.rounds += 1
    hook: Any = default_hooks.allreduce_hook  # its process-group argument may be None (the default group)
    future: torch.futures.Future[torch.Tensor] = hook(None, bucket)
    return future


def build_model(seed: int) -> torch.nn.Module:
    generator_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        return torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(), torch.nn.Linear(WIDTH, WIDTH))
    finally:
        torch.random.set_rng_state(generator_state)


def build_optimizers(models: list[torch.nn.Module]) -> list[torch.optim.Optimizer]:
    return [
        torch.optim.SGD(models[0].parameters(), lr=LEARNING_RATE),
        torch.optim.Adam(models[1].parameters(), lr=LEARNING_RATE),
    ]


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
        models = [DistributedDataParallel(build_model(seed)) for seed in (0, 1)]
        plain = build_optimizers(models)
        skip_sync = impl == "raw"

        def micro_step(batch_idx: int) -> None:
            closes = (batch_idx + 1) % ACCUMULATE == 0
            for model, optimizer in zip(models, plain, strict=True):
                sync: AbstractContextManager[Any] = nullcontext() if closes or not skip_sync else model.no_sync()
                with sync:
                    loss = mse(model(inputs), targets) / ACCUMULATE
                    loss.backward()
                if closes:
                    optimizer.step()
                    optimizer.zero_grad()

    else:
        raise ValueError(f"unknown DDP implementation {impl!r}; expected one of {', '.join(IMPLEMENTATIONS)}")
    for model in models:
        if not isinstance(model, DistributedDataParallel):
            raise AssertionError(f"{impl}: the model is a {type(model).__name__}, not DistributedDataParallel")
    counters = [_Counter() for _ in models]
    for model, counter in zip(models, counters, strict=True):
        model.register_comm_hook(counter, _counting_allreduce)
    window_ns = time_windows(micro_step, warmup, windows, after_warmup=lambda: _reset(counters))
    return {
        "window_ns": window_ns,
        "allreduces": sum(counter.allreduces for counter in counters),
        "rounds": sum(counter.rounds for counter in counters),
        "models": len(models),
        "peak_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def _reset(counters: list[_Counter]) -> None:
    for counter in counters:
        counter.allreduces = counter.rounds = 0


def reference_loop(
    info: ImplementationInfo[Any], cell: Cell, inputs: torch.Tensor, targets: torch.Tensor
) -> tuple[list[torch.nn.Module], Callable[[int], None]]:
    """The reference's two models and wrappers for ``cell``, and its micro-step (closure form, one batch block)."""
    context = info.factory(cell, accumulate_grad_batches=ACCUMULATE)
    models = [context.prepare_module(build_model(seed)) for seed in (0, 1)]
    wrappers = [context.wrap(optimizer) for optimizer in build_optimizers(models)]

    def micro_step(batch_idx: int) -> None:
        with context.batch(batch_idx):
            for model, wrapper in zip(models, wrappers, strict=True):

                def closure(model: torch.nn.Module = model, wrapper: Any = wrapper) -> torch.Tensor:
                    loss = mse(model(inputs), targets)
                    wrapper.backward(loss)
                    return loss

                wrapper.step(closure)

    return models, micro_step


def time_windows(
    micro_step: Callable[[int], None], warmup: int, windows: int, *, after_warmup: Callable[[], object]
) -> list[int]:
    """``warmup`` untimed windows, ``after_warmup()``, then the wall time of each of ``windows`` windows (ns)."""
    batch_idx = 0
    for _ in range(warmup * ACCUMULATE):
        micro_step(batch_idx)
        batch_idx += 1
    after_warmup()
    window_ns = []
    for _ in range(windows):
        dist.barrier()
        start = time.perf_counter_ns()
        for _ in range(ACCUMULATE):
            micro_step(batch_idx)
            batch_idx += 1
        window_ns.append(time.perf_counter_ns() - start)
    return window_ns


@dataclass
class DdpRuns:
    """Per implementation: each run's window times and peak memory on rank 0, and the all-reduce counts."""

    windows: int
    runs: dict[str, list[RunResult]] = field(default_factory=dict)
    allreduces_per_window: dict[str, float] = field(default_factory=dict)
    rounds_per_window_per_model: dict[str, float] = field(default_factory=dict)


@contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """File descriptor 1 pointed at the standard error while the ranks start (and print)."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, 1)
        os.close(saved)


def measure_ddp(
    runs: int, windows: int, warmup: int, threads: int, progress: Callable[[str], None] | None = None
) -> DdpRuns:
    """Time the three loops, alternating, each run on a fresh pool of 2 gloo ranks; check the ranks' counts."""
    from lightning_optimizer.conformance.ranks import RankPool

    cell = Cell("cpu", "32-true", WORLD_SIZE)
    result = DdpRuns(windows, {impl: [] for impl in IMPLEMENTATIONS})
    counts: dict[str, list[tuple[int, int, int]]] = {impl: [] for impl in IMPLEMENTATIONS}
    for index in range(runs):
        for impl in IMPLEMENTATIONS:
            pool = RankPool("lightning_optimizer.reference", "cpu", WORLD_SIZE, scenarios=__name__)
            try:
                with stdout_to_stderr():  # the ranks inherit it: gloo's connection messages stay off the table
                    ranks = pool.run("train_windows", cell, impl=impl, windows=windows, warmup=warmup, threads=threads)
            finally:
                pool.stop()
            run = RunResult(CASE, impl, step_ns=ranks[0]["window_ns"], peak_rss_kib=ranks[0]["peak_rss_kib"])
            result.runs[impl].append(run)
            counts[impl].extend((r["allreduces"], r["rounds"], r["models"]) for r in ranks)
            if progress is not None:
                progress(f"{CASE} run {index + 1}/{runs} {impl}")
    for impl, per_rank in counts.items():
        if len(set(per_rank)) != 1:
            raise RuntimeError(f"{impl}: the ranks counted different all-reduces: {sorted(set(per_rank))}")
        allreduces, rounds, models = per_rank[0]
        result.allreduces_per_window[impl] = allreduces / windows
        result.rounds_per_window_per_model[impl] = rounds / windows / models
    return result
