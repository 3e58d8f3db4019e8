"""Interleaved timing of one case: the implementations take short turns in random order, in a fresh process.

Each case runs in its own process (spawned), so that one framework's process-wide state (Accelerate's
singleton, autocast caches, thread settings) never carries into another case. Within the case a repeat is a
series of rounds; in each round every implementation, in a shuffled order, runs one turn: an untimed
iteration to warm the caches back up (small model), then a few timed ones back to back. Short turns keep the
implementations of a round within milliseconds of each other, so drift in the machine's load (other
processes, a busy sibling core) reaches all of them alike; the shuffle gives each the same mix of
predecessors. :func:`bench.report.summarise` takes the ratios to raw PyTorch round by round.
"""

from __future__ import annotations

import cProfile
import gc
import io
import pstats
import random
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from multiprocessing import get_context
from typing import TYPE_CHECKING

from bench.cases import TIMED_CASES
from bench.report import Samples

if TYPE_CHECKING:  # imported in the case's process only: the parent never imports torch or a framework
    from bench.loops import Loop


@dataclass(frozen=True)
class Settings:
    """How long to time: repeats, iterations per repeat, warm-up, threads, and an optional profile."""

    device: str = "cpu"
    repeats: int = 20
    iterations: int | None = None
    """Iterations per repeat; ``None``: the model's default."""
    warmup: int | None = None
    threads: int = 1
    profile: str | None = None
    """An implementation to run under cProfile after the timing, for a breakdown of its time."""


@dataclass
class CaseSamples:
    """What a case's process sends back."""

    case: str
    iterations: int
    samples: Samples = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    profile: str = ""


def measure_case_in_subprocess(case: str, impls: tuple[str, ...], settings: Settings) -> CaseSamples:
    """:func:`measure_case` in a fresh spawned process."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(measure_case, case, impls, settings).result()


def measure_case(case_name: str, impls: tuple[str, ...], settings: Settings) -> CaseSamples:
    """Build every available implementation's loop for the case, warm each up, then time them interleaved."""
    import torch

    from bench.loops import Unavailable, build_loop, quiet_frameworks

    quiet_frameworks()
    torch.set_num_threads(settings.threads)
    case = TIMED_CASES[case_name]
    device = torch.device(settings.device)
    iterations = settings.iterations or case.model.iterations
    warmup = case.model.warmup if settings.warmup is None else settings.warmup
    result = CaseSamples(case_name, iterations)
    loops: list[Loop] = []
    for impl in impls:
        try:
            loop = build_loop(impl, case, device)
        except Unavailable as exc:
            result.unavailable[impl] = str(exc)
            continue
        loops.append(loop)
        result.notes[impl] = loop.note
        result.samples[impl] = []
    try:
        for loop in loops:
            loop.run(warmup)
        shuffle = random.Random(0).shuffle
        turn = min(case.model.turn, iterations)
        for _ in range(settings.repeats):
            repeat = _interleaved_repeat(loops, iterations, turn, case.model.rewarm, settings.threads, shuffle)
            for impl, rounds in repeat.items():
                result.samples[impl].append(rounds)
        if settings.profile is not None:
            chosen = next((loop for loop in loops if loop.impl == settings.profile), None)
            if chosen is None:
                raise ValueError(f"--profile {settings.profile}: not one of the implementations run here")
            result.profile = _profile(chosen, iterations * 10)
    finally:
        for loop in loops:
            loop.close()
    return result


def _interleaved_repeat(
    loops: list[Loop], iterations: int, turn: int, rewarm: int, threads: int, shuffle: Callable[[list[Loop]], None]
) -> dict[str, list[list[int]]]:
    """One repeat: rounds of one turn per loop, in shuffled order, until each loop has ``iterations`` samples."""
    import torch

    torch.set_num_threads(threads)  # a framework may have changed it while setting up
    rounds: dict[str, list[list[int]]] = {loop.impl: [] for loop in loops}
    order = list(loops)
    gc.collect()
    gc.disable()
    try:
        for done in range(0, iterations, turn):
            shuffle(order)
            for loop in order:
                if rewarm:
                    loop.run(rewarm)
                rounds[loop.impl].append(loop.run(min(turn, iterations - done)))
    finally:
        gc.enable()
    return rounds


def _profile(loop: Loop, iterations: int) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    loop.run(iterations)
    profiler.disable()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(30)
    return f"cProfile of {loop.impl}, {iterations} iterations, by own time:\n{out.getvalue()}"
