"""Several ranks of one ``torch.distributed`` process group, started once and reused by every DDP cell.

Starting a group per cell costs seconds each; one pool per device kind serves the whole session instead. Ranks
are forked from a server process that has imported torch once (multiprocessing's ``forkserver``, where the
platform has it; ``spawn`` elsewhere): a new rank then starts in a fraction of a second instead of importing torch
anew, and gets the parent's ``sys.path`` and environment as they are when it starts, as a spawned one would. The
parent sends each rank the name of a scenario (a function in :mod:`lightning_optimizer.conformance.scenarios`, or
``"module:function"`` elsewhere) and gets back what it returns. A rank that raises, dies or does not answer within
the timeout fails the cell with a message that says which rank and why; the pool is then stopped (no process is
left behind) and the next cell starts a new one.

A rank's standard error goes to a log file of the pool, with :mod:`faulthandler` on: the failure of a rank that died
quotes the end of its log, native crash and Python stack included. A rank killed by a signal (an abort in a
collective library, say) fails the scenario only if it does so again on a fresh pool: the first crash is reported as
a :class:`RankCrashWarning` with that log, and the scenario runs once more.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import shutil
import socket
import tempfile
import time
import traceback
import warnings
from dataclasses import dataclass
from datetime import timedelta
from multiprocessing.context import BaseContext
from multiprocessing.process import BaseProcess
from typing import Any

from lightning_optimizer.spec import Cell

__all__ = ["RankCrashWarning", "RankFailure", "RankPool"]

ANSWER_TIMEOUT_S = 300.0
"""How long the pool waits for a scenario's answer: a hang guard (the longest answer seen on a loaded 2-core machine
took about 10 s)."""
START_TIMEOUT_S = 300.0
"""How long the pool waits for its ranks to start: a hang guard (at most about 5 s on a loaded 2-core machine)."""
PROCESS_GROUP_TIMEOUT_S = 600.0
"""torch.distributed's own timeout in each rank: above the pool's answer timeout, so the pool reports a hang first."""
REAP_TIMEOUT_S = 60.0
"""How long a killed rank may take to be reaped (the join returns as soon as it is gone)."""
FAILED_GRACE_S = 2.0
"""How long the ranks of a failed pool get to leave by themselves before they are killed: one may hang for good."""
LOG_TAIL_LINES = 40
"""How many of a dead rank's last log lines its failure quotes."""
PRELOAD = ["torch", "torch.distributed"]
"""What the fork server imports once for every rank it starts: most of a rank's start-up time. Not torch_xla, whose
SPMD mode a rank must choose before the runtime starts (:func:`.spmd.start_spmd`)."""


def _start_method() -> BaseContext:
    """The ``forkserver`` start method, preloading :data:`PRELOAD`, where the platform has one; else ``spawn``."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return context


class RankFailure(RuntimeError):
    """A rank raised, died or did not answer in time."""

    def __init__(self, message: str, *, crashed: bool = False) -> None:
        super().__init__(message)
        self.crashed = crashed
        """Whether a rank was killed by a signal: a crash, not an error that the scenario raised or a hang."""


class RankCrashWarning(UserWarning):
    """A rank was killed by a signal and its scenario passed when run again on a fresh pool."""


@dataclass(frozen=True)
class _Request:
    scenario: str
    cell: Cell
    kwargs: dict[str, Any]
    impl: str


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _scenario(default: Any, name: str) -> Any:
    """The scenario ``name``: a function of the pool's scenarios module, or ``"module:function"`` of another."""
    import importlib

    module_name, _, function = name.rpartition(":")
    module = importlib.import_module(module_name) if module_name else default
    return getattr(module, function)


def _serve(
    rank: int,
    world_size: int,
    port: int,
    backend: str,
    impl: str,
    module: str,
    requests: Any,
    answers: Any,
    spmd_devices: int | None,
    environ: dict[str, str],
    log_path: str,
) -> None:  # pragma: no cover - runs in the child processes
    """A rank's loop: take the parent's environment, join the group, run scenarios until told to stop (``None``)."""
    try:
        import faulthandler
        import importlib

        log = open(log_path, "a", buffering=1)  # noqa: SIM115 - open for the process's whole life
        os.dup2(log.fileno(), 2)  # native libraries' messages too
        faulthandler.enable(file=log, all_threads=True)

        os.environ.clear()  # a forked rank starts with the fork server's environment, not the parent's of now
        os.environ.update(environ)

        if spmd_devices is not None:
            from lightning_optimizer.conformance.spmd import start_spmd

            start_spmd(spmd_devices, os.path.join(os.path.dirname(log_path), f"hlo-rank-{rank}"))  # the pool's folder

        import torch.distributed as dist

        from lightning_optimizer.conformance.selection import load_implementation

        scenarios = importlib.import_module(module)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), LOCAL_RANK=str(rank))
        os.environ["WORLD_SIZE"] = str(world_size)
        dist.init_process_group(
            backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=PROCESS_GROUP_TIMEOUT_S)
        )
        infos = {impl: load_implementation(impl).info}
        answers.put((rank, "ready", None))
    except BaseException:
        answers.put((rank, "error", traceback.format_exc()))
        return
    try:
        while (request := requests.get()) is not None:
            try:
                if request.impl not in infos:
                    infos[request.impl] = load_implementation(request.impl).info
                result = _scenario(scenarios, request.scenario)(infos[request.impl], request.cell, **request.kwargs)
                answers.put((rank, "ok", result))
            except BaseException:
                answers.put((rank, "error", traceback.format_exc()))
    finally:
        dist.destroy_process_group()


class RankPool:
    """``world_size`` processes, each one rank of a process group on 127.0.0.1, serving scenario requests.

    With ``spmd_devices=n`` each process drives ``n`` XLA devices under SPMD instead (:func:`.spmd.start_spmd`,
    before anything else runs there): one process, several devices, as the XLA cells of world size ``n`` need.
    Each request runs on the implementation ``impl`` names at the time (the ranks load each one once), so one pool
    can serve the sessions of several implementations in turn.
    """

    def __init__(
        self,
        impl: str,
        device: str,
        world_size: int = 2,
        *,
        scenarios: str = "lightning_optimizer.conformance.scenarios",
        answer_timeout: float = ANSWER_TIMEOUT_S,
        spmd_devices: int | None = None,
    ) -> None:
        self.impl, self.device, self.world_size = impl, device, world_size
        self.spmd_devices = spmd_devices
        self.scenarios, self.answer_timeout = scenarios, answer_timeout
        self._processes: list[BaseProcess] = []
        self._requests: list[Any] = []
        self._answers: Any = None
        self._log_dir: str | None = None

    def run(self, scenario: str, cell: Cell, **kwargs: Any) -> list[Any]:
        """Run ``scenario`` on every rank; return the results in rank order, or raise :class:`RankFailure`.

        A scenario during which a rank crashed (was killed by a signal) runs once more on a fresh pool; a second
        crash fails it, a pass is reported as a :class:`RankCrashWarning` that quotes the crashed rank's log.
        """
        try:
            return self._run_once(scenario, cell, kwargs)
        except RankFailure as failure:
            if not failure.crashed:
                raise
            warnings.warn(RankCrashWarning(f"{failure}\n(the scenario runs once more on a fresh pool)"), stacklevel=2)
        return self._run_once(scenario, cell, kwargs)

    def _run_once(self, scenario: str, cell: Cell, kwargs: dict[str, Any]) -> list[Any]:
        if not self._processes:
            self._start()
        for requests in self._requests:
            requests.put(_Request(scenario, cell, kwargs, self.impl))
        try:
            answers = self._collect(self.answer_timeout, f"scenario {scenario!r} on {cell.id}")
        except RankFailure:
            self.stop(grace=FAILED_GRACE_S)
            raise
        return [answers[rank] for rank in range(self.world_size)]

    @property
    def alive(self) -> int:
        """How many rank processes are running."""
        return sum(process.is_alive() for process in self._processes)

    def stop(self, grace: float = 10.0) -> None:
        """Ask the ranks to leave, kill those still there after ``grace`` seconds; no process outlives this call."""
        for requests in self._requests:
            requests.put(None)
        deadline = time.monotonic() + grace
        for process in self._processes:
            process.join(timeout=max(0.0, deadline - time.monotonic()))
        for process in self._processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=REAP_TIMEOUT_S)
        self._processes, self._requests, self._answers = [], [], None
        if self._log_dir is not None:
            shutil.rmtree(self._log_dir, ignore_errors=True)
            self._log_dir = None

    def _start(self) -> None:
        context: Any = _start_method()  # typeshed gives BaseContext no Process or Queue
        backend = "nccl" if self.device == "cuda" else "gloo"
        port = _free_port()
        self._answers = context.Queue()
        self._requests = [context.Queue() for _ in range(self.world_size)]
        self._log_dir = tempfile.mkdtemp(prefix="conformance-ranks-")
        for rank in range(self.world_size):
            args = (
                rank,
                self.world_size,
                port,
                backend,
                self.impl,
                self.scenarios,
                self._requests[rank],
                self._answers,
                self.spmd_devices,
                dict(os.environ),
                self._log_path(rank),
            )
            process = context.Process(target=_serve, args=args, daemon=True, name=f"conformance-rank-{rank}")
            process.start()
            self._processes.append(process)
        try:
            self._collect(START_TIMEOUT_S, f"joining a {backend} process group of {self.world_size} ranks")
        except RankFailure:
            self.stop(grace=FAILED_GRACE_S)
            raise

    def _log_path(self, rank: int) -> str:
        assert self._log_dir is not None
        return os.path.join(self._log_dir, f"rank-{rank}.log")

    def _dead(self) -> str:
        """Which ranks died, how, and the end of each one's log; empty while all are alive."""
        reports = []
        for rank, process in enumerate(self._processes):
            if process.is_alive():
                continue
            report = f"{process.name} died (exit code {process.exitcode})"
            try:
                with open(self._log_path(rank), errors="replace") as log:
                    tail = "".join(log.readlines()[-LOG_TAIL_LINES:]).rstrip()
            except OSError:
                tail = ""
            reports.append(f"{report}, the end of its log:\n{tail}" if tail else report)
        return "; ".join(reports)

    def _crashed(self) -> bool:
        return any((p.exitcode or 0) < 0 for p in self._processes if not p.is_alive())

    def _collect(self, timeout: float, what: str) -> dict[int, Any]:
        answers: dict[int, Any] = {}
        deadline = timeout
        while len(answers) < self.world_size:
            try:
                rank, status, payload = self._answers.get(timeout=min(deadline, 1.0))
            except queue.Empty:
                deadline -= 1.0
                if self._dead():
                    raise RankFailure(f"{self._dead()} while {what}", crashed=self._crashed()) from None
                if deadline <= 0:
                    missing = sorted(set(range(self.world_size)) - set(answers))
                    raise RankFailure(f"rank(s) {missing} did not answer within {timeout:.0f} s while {what}") from None
                continue
            if status == "error":
                time.sleep(0.5)  # a peer that died is often why this rank failed: say so first
                cause = f"{self._dead()}; " if self._dead() else ""
                raise RankFailure(f"{cause}rank {rank} raised while {what}:\n{payload}", crashed=self._crashed())
            answers[rank] = payload
        return answers
