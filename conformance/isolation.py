"""Isolation of global state between checks: a snapshot before each check, a leak check and a restore after.

An implementation that changes process-wide state inside a check (the default dtype, grad or inference mode,
autocast, anomaly mode, deterministic or cuDNN/TF32 flags, the number of threads, the default device, a default
process group, environment variables) and leaves it changed would make the next cell run in conditions its
oracle does not assume. :func:`restore` puts every such setting back to its value before the check and returns
what had leaked; the plugin fails the check that leaked it (:class:`StateLeak`).

What happens before the first check is the baseline, not a leak: the plugin's configuration (XLA brought up),
the import of the implementation's module, pytest's own ``PYTEST_CURRENT_TEST``. Rank processes of DDP cells
are separate processes and leave this one alone.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed

from lightning_optimizer.spec import DEVICE_KINDS

__all__ = ["IGNORED_ENVIRONMENT", "SETTINGS", "Leak", "Setting", "Snapshot", "StateLeak", "restore", "snapshot"]

IGNORED_ENVIRONMENT = frozenset({"PYTEST_CURRENT_TEST", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"})
"""Variables that are not an implementation's to leak: pytest's own, and the cache folders that torch itself
records in the environment the first time it needs them (torch 2.13 does so on the first float16 autocast on CPU)."""

_VALUE_WIDTH = 80


@dataclass(frozen=True)
class Setting:
    """One piece of global state: how to read it, how to set it back, and how to show a value."""

    what: str
    read: Callable[[], Any]
    write: Callable[[Any], None]
    show: Callable[[Any], str] = repr


@dataclass(frozen=True)
class Leak:
    """A setting a check left changed: its value before and after, and whether :func:`restore` could undo it."""

    what: str
    before: str
    after: str
    restored: bool = True

    def __str__(self) -> str:
        undone = "" if self.restored else " (could not be restored: later checks run with it)"
        return f"{self.what}: {self.before} before the check, {self.after} after{undone}"


class StateLeak(AssertionError):
    """A check left global state changed; the message names each setting with its values before and after."""

    def __init__(self, leaks: list[Leak]) -> None:
        self.leaks = leaks
        restored = " (restored for the next check)" if all(leak.restored for leak in leaks) else ""
        super().__init__(f"leaked global state{restored}: " + "; ".join(map(str, leaks)))


@dataclass(frozen=True)
class Snapshot:
    """The value of every setting and a copy of the environment, at one moment."""

    values: dict[str, Any]
    environment: dict[str, str]


# -- the settings ---------------------------------------------------------------------------------------------

_held_modes: list[Any] = []
"""Inference-mode guards that undo a leaked ``torch.inference_mode()`` (a guard must stay alive to hold)."""


def _set_inference_mode(enabled: bool) -> None:
    mode = torch.inference_mode(enabled)
    mode.__enter__()
    _held_modes.append(mode)


def _set_grad_mode(enabled: bool) -> None:
    torch.set_grad_enabled(enabled)


def _autocast_nesting() -> int:
    """How many autocast regions are open (torch has no getter: step the counter up and back down)."""
    nesting = torch.autocast_increment_nesting() - 1
    torch.autocast_decrement_nesting()
    return nesting


def _set_autocast_nesting(target: int) -> None:
    nesting = _autocast_nesting()
    while nesting < target:
        nesting = torch.autocast_increment_nesting()
    while nesting > target:
        nesting = torch.autocast_decrement_nesting()
    if nesting == 0:
        torch.clear_autocast_cache()


def _set_deterministic(value: tuple[bool, bool]) -> None:
    torch.use_deterministic_algorithms(value[0], warn_only=value[1])


def _show_deterministic(value: tuple[bool, bool]) -> str:
    return ("on, warn only" if value[1] else "on") if value[0] else "off"


def _set_anomaly(value: tuple[bool, bool]) -> None:
    torch.set_anomaly_enabled(value[0], value[1])


def _show_anomaly(value: tuple[bool, bool]) -> str:
    return ("on, checking NaN" if value[1] else "on") if value[0] else "off"


def _default_device() -> torch.device:
    """Where a factory call without ``device=`` puts its tensor (``torch.get_default_device`` can fail on 2.9)."""
    return torch.empty(0).device


def _set_default_device(device: torch.device) -> None:
    torch.set_default_device(device)


def _process_group() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def _set_process_group(initialized: bool) -> None:
    if not initialized and _process_group():
        torch.distributed.destroy_process_group()


def _attribute(owner: Any, name: str, what: str) -> Setting:
    def write(value: Any) -> None:
        setattr(owner, name, value)

    return Setting(what, lambda: getattr(owner, name), write)


def _autocast(device_type: str) -> Iterator[Setting]:
    def write_enabled(enabled: bool) -> None:
        torch.set_autocast_enabled(device_type, enabled)

    def write_dtype(dtype: torch.dtype) -> None:
        torch.set_autocast_dtype(device_type, dtype)

    yield Setting(f"autocast ({device_type})", lambda: torch.is_autocast_enabled(device_type), write_enabled)
    yield Setting(f"autocast dtype ({device_type})", lambda: torch.get_autocast_dtype(device_type), write_dtype)


def _backend_flags() -> Iterator[Setting]:
    """cuDNN, oneDNN and TF32 switches that change results; only those this torch has."""
    backends = torch.backends
    yield _attribute(backends.cudnn, "enabled", "cuDNN enabled")
    yield _attribute(backends.cudnn, "benchmark", "cuDNN benchmark")
    yield _attribute(backends.cudnn, "deterministic", "cuDNN deterministic")
    yield _attribute(backends.mkldnn, "enabled", "oneDNN enabled")
    # The fp32_precision settings (torch >= 2.9) also carry torch.set_float32_matmul_precision and allow_tf32,
    # whose getters warn there.
    for owner, name in (
        (getattr(backends.cuda, "matmul", None), "CUDA matmul fp32 precision"),
        (getattr(backends.cudnn, "conv", None), "cuDNN conv fp32 precision"),
        (getattr(backends.cudnn, "rnn", None), "cuDNN rnn fp32 precision"),
    ):
        if owner is not None and hasattr(owner, "fp32_precision"):
            yield _attribute(owner, "fp32_precision", name)


def _settings() -> list[Setting]:
    found = [
        Setting("inference mode", torch.is_inference_mode_enabled, _set_inference_mode),
        Setting("grad mode", torch.is_grad_enabled, _set_grad_mode),
        Setting("default dtype", torch.get_default_dtype, torch.set_default_dtype),
        Setting("default device", _default_device, _set_default_device, str),
    ]
    for device_type in DEVICE_KINDS:
        found += _autocast(device_type)
    found += [
        Setting("autocast weight cache", torch.is_autocast_cache_enabled, torch.set_autocast_cache_enabled),
        Setting("open autocast regions", _autocast_nesting, _set_autocast_nesting),
        Setting(
            "anomaly detection",
            lambda: (torch.is_anomaly_enabled(), torch.is_anomaly_check_nan_enabled()),
            _set_anomaly,
            _show_anomaly,
        ),
        Setting(
            "deterministic algorithms",
            lambda: (
                torch.are_deterministic_algorithms_enabled(),
                torch.is_deterministic_algorithms_warn_only_enabled(),
            ),
            _set_deterministic,
            _show_deterministic,
        ),
        *_backend_flags(),
        Setting("intra-op threads", torch.get_num_threads, torch.set_num_threads),
        Setting("default process group initialized", _process_group, _set_process_group),
    ]
    return found


SETTINGS: tuple[Setting, ...] = tuple(_settings())
"""Every setting that is checked, in the order they are restored (inference mode before grad mode)."""


# -- snapshot and restore -------------------------------------------------------------------------------------


def _environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if name not in IGNORED_ENVIRONMENT}


def snapshot() -> Snapshot:
    """Read every setting and copy the environment."""
    return Snapshot({setting.what: setting.read() for setting in SETTINGS}, _environment())


def _shown_variable(value: str | None) -> str:
    if value is None:
        return "unset"
    text = repr(value)
    return text if len(text) <= _VALUE_WIDTH else text[: _VALUE_WIDTH - 4] + "...'"


def _restore_environment(before: dict[str, str]) -> list[Leak]:
    after = _environment()
    leaks = []
    for name in sorted(before.keys() | after.keys()):
        old, new = before.get(name), after.get(name)
        if old == new:
            continue
        if old is None:
            del os.environ[name]
        else:
            os.environ[name] = old
        restored = os.environ.get(name) == old
        leaks.append(Leak(f"environment variable {name}", _shown_variable(old), _shown_variable(new), restored))
    return leaks


def restore(before: Snapshot) -> list[Leak]:
    """Set back every setting that differs from ``before``; return what had leaked (empty when nothing did).

    Every setting is read before any is restored, so a leak reports the state the check left behind.
    """
    after = {setting.what: setting.read() for setting in SETTINGS}
    changed = [setting for setting in SETTINGS if after[setting.what] != before.values[setting.what]]
    for setting in changed:
        old = before.values[setting.what]
        if setting.read() != old:  # restoring an earlier setting (inference mode) may have restored this one
            with contextlib.suppress(Exception):
                setting.write(old)
    leaks = []
    for setting in changed:
        old, new = before.values[setting.what], after[setting.what]
        leaks.append(Leak(setting.what, setting.show(old), setting.show(new), setting.read() == old))
    return leaks + _restore_environment(before.environment)
