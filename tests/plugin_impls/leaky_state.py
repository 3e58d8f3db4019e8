"""The reference, leaking global state from its first cell; in every later cell it checks that none is left.

Each record is ``--impl=plugin_impls.leaky_state:<kind>`` (or ``:everything``, every kind at once). On the
``64-true`` cell (the first of the matrix order) ``wrap()`` changes the global state of that kind and leaves it
changed; on any other cell the factory raises if it finds that state still changed, so a later check passes only
if the suite put the state back in between.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch.amp.grad_scaler import GradScaler

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import CONTRACT_VERSION, Cell, FailurePolicy, GradScalerSettings, ImplementationInfo

LEAKING_PRECISION = "64-true"
ENV_VAR = "LIGHTNING_OPTIMIZER_LEAKED_BY_TEST"
_THREADS = torch.get_num_threads()
_STORE = tempfile.TemporaryDirectory()
"""Where a leaked process group keeps its file store (removed when the interpreter exits)."""
_held: list[Any] = []
"""Context managers entered and never exited (a leaked ``with`` block)."""


def _enter(manager: Any) -> None:
    manager.__enter__()
    _held.append(manager)


def _set_env() -> None:
    os.environ[ENV_VAR] = "1"


def _init_process_group() -> None:
    store = Path(_STORE.name) / f"store-{len(os.listdir(_STORE.name))}"
    dist.init_process_group("gloo", init_method=store.as_uri(), rank=0, world_size=1)


def _disable_grad() -> None:
    torch.set_grad_enabled(False)


def _set_cudnn_benchmark() -> None:
    torch.backends.cudnn.benchmark = True


LEAKS: dict[str, tuple[str, Callable[[], None], Callable[[], bool]]] = {
    # kind: (what the suite must name, how to leak it, whether it is still leaked)
    "dtype": (
        "default dtype",
        lambda: torch.set_default_dtype(torch.float64),
        lambda: torch.get_default_dtype() != torch.float32,
    ),
    "grad_mode": ("grad mode", _disable_grad, lambda: not torch.is_grad_enabled()),
    "autocast": (
        "autocast (cpu)",
        lambda: _enter(torch.autocast("cpu", dtype=torch.bfloat16)),
        lambda: torch.is_autocast_enabled("cpu"),
    ),
    "env": (f"environment variable {ENV_VAR}", _set_env, lambda: ENV_VAR in os.environ),
    "deterministic": (
        "deterministic algorithms",
        lambda: torch.use_deterministic_algorithms(True, warn_only=True),
        torch.are_deterministic_algorithms_enabled,
    ),
    "inference_mode": (
        "inference mode",
        lambda: _enter(torch.inference_mode()),
        torch.is_inference_mode_enabled,
    ),
    "anomaly": ("anomaly detection", lambda: torch.set_anomaly_enabled(True), torch.is_anomaly_enabled),
    "threads": (
        "intra-op threads",
        lambda: torch.set_num_threads(_THREADS + 1),
        lambda: torch.get_num_threads() != _THREADS,
    ),
    "default_device": (
        "default device",
        lambda: torch.set_default_device("meta"),
        lambda: torch.empty(0).device.type == "meta",
    ),
    "cudnn": ("cuDNN benchmark", _set_cudnn_benchmark, lambda: bool(torch.backends.cudnn.benchmark)),
    "process_group": ("default process group initialized", _init_process_group, dist.is_initialized),
}
INDIVIDUAL = ("dtype", "grad_mode", "autocast", "env", "deterministic")
"""The kinds with a run of their own; ``everything`` leaks every kind of ``LEAKS`` at once."""


def _leaky(kinds: tuple[str, ...]) -> Callable[..., TrainingContext]:
    class LeakyContext(TrainingContext):
        def wrap(self, optimizer: torch.optim.Optimizer) -> Any:
            wrapped = super().wrap(optimizer)
            if self.precision == LEAKING_PRECISION:
                for kind in kinds:
                    LEAKS[kind][1]()
            return wrapped

    def factory(
        cell: Cell,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        grad_scaler: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> TrainingContext:
        left = [LEAKS[kind][0] for kind in kinds if LEAKS[kind][2]()]
        if left:
            raise AssertionError(f"{cell.id} starts with the state a previous cell leaked: {', '.join(left)}")
        scaler = None if grad_scaler is None else GradScaler(cell.device, **grad_scaler.as_kwargs())
        return LeakyContext(
            cell.precision,
            cell.device,
            accumulate_grad_batches,
            gradient_clip_val=gradient_clip_val,
            gradient_clip_algorithm=gradient_clip_algorithm,
            scaler=scaler,
            on_failure=on_failure,
            zero_grad_after_step=zero_grad_after_step,
        )

    return factory


def _info(*kinds: str) -> ImplementationInfo[TrainingContext]:
    return ImplementationInfo(
        name=f"leaks {', '.join(kinds)}",
        version="0",
        contract_version=CONTRACT_VERSION,
        factory=_leaky(kinds),
        precisions=frozenset({"64-true", "32-true"}),
    )


def everything() -> ImplementationInfo[TrainingContext]:
    return _info(*LEAKS)


def dtype() -> ImplementationInfo[TrainingContext]:
    return _info("dtype")


def grad_mode() -> ImplementationInfo[TrainingContext]:
    return _info("grad_mode")


def autocast() -> ImplementationInfo[TrainingContext]:
    return _info("autocast")


def env() -> ImplementationInfo[TrainingContext]:
    return _info("env")


def deterministic() -> ImplementationInfo[TrainingContext]:
    return _info("deterministic")
