"""Which implementation is under test, which cells run, and why a cell does not run.

Nothing here imports pytest: the plugin turns :class:`SelectionError` into a usage error.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from lightning_optimizer.spec import (
    CONTRACT_VERSION,
    DEVICE_KINDS,
    FEATURES,
    PRECISIONS,
    Cell,
    ImplementationInfo,
)

__all__ = [
    "DEFAULT_IMPL",
    "KNOWN_CONTRACT_VERSIONS",
    "WORLD_SIZES",
    "CellFilter",
    "SelectionError",
    "cells",
    "devices_found",
    "load_implementation",
    "parse_list",
    "start_xla_early",
    "unavailable_reason",
]

DEFAULT_IMPL = "lightning_optimizer.reference"
KNOWN_CONTRACT_VERSIONS = frozenset({CONTRACT_VERSION})
WORLD_SIZES: tuple[int, ...] = (1, 2)

NameT = TypeVar("NameT", bound=str)


class SelectionError(ValueError):
    """Bad input to the suite: an unusable ``--impl`` or an unknown name in a filter."""


@dataclass(frozen=True)
class LoadedImplementation:
    """An implementation record and where it came from."""

    info: ImplementationInfo[Any]
    module: str


def load_implementation(spec: str) -> LoadedImplementation:
    """Import ``module`` or ``module:attr`` and validate the :class:`ImplementationInfo` it exposes.

    ``attr`` (default ``conformance_info``) is either the record itself or a function returning it.
    """
    module_name, _, attr = spec.partition(":")
    attr = attr or "conformance_info"
    if not module_name:
        raise SelectionError("--impl is empty: name a module, e.g. --impl=lightning_optimizer.reference")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and (exc.name == module_name or module_name.startswith(exc.name + ".")):
            raise SelectionError(f"--impl={spec}: no module named {module_name!r} can be imported") from exc
        raise SelectionError(f"--impl={spec}: importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise SelectionError(f"--impl={spec}: importing {module_name!r} raised {type(exc).__name__}: {exc}") from exc
    target = getattr(module, attr, None)
    if target is None:
        raise SelectionError(
            f"--impl={spec}: module {module_name!r} has no {attr!r}; define conformance_info() returning a "
            "lightning_optimizer.spec.ImplementationInfo"
        )
    info = target() if callable(target) and not isinstance(target, ImplementationInfo) else target
    if not isinstance(info, ImplementationInfo):
        raise SelectionError(
            f"--impl={spec}: {module_name}.{attr} gave a {type(info).__name__}, not a "
            "lightning_optimizer.spec.ImplementationInfo"
        )
    _validate(info, spec)
    return LoadedImplementation(info, module_name)


def _validate(info: ImplementationInfo[Any], spec: str) -> None:
    def unknown(kind: str, names: Iterable[object], known: Sequence[object]) -> None:
        bad = sorted(str(name) for name in names if name not in known)
        if bad:
            raise SelectionError(
                f"--impl={spec}: claims unknown {kind} {', '.join(bad)}; known: {', '.join(map(str, known))}"
            )

    name: object = info.name
    if not isinstance(name, str) or not name:
        raise SelectionError(f"--impl={spec}: the implementation's name must be a non-empty string")
    if info.contract_version not in KNOWN_CONTRACT_VERSIONS:
        raise SelectionError(
            f"--impl={spec}: follows contract version {info.contract_version!r}; this suite checks "
            f"{', '.join(sorted(KNOWN_CONTRACT_VERSIONS))}"
        )
    if not callable(info.factory):
        raise SelectionError(f"--impl={spec}: factory must be callable, got {type(info.factory).__name__}")
    unknown("devices", info.devices, DEVICE_KINDS)
    unknown("precisions", info.precisions, PRECISIONS)
    unknown("world sizes", info.world_sizes, WORLD_SIZES)
    unknown("features", info.features, FEATURES)


def parse_list(option: str, value: str | None, known: Sequence[NameT]) -> tuple[NameT, ...]:
    """Parse a comma-separated filter; ``None`` or ``all`` selects every known name."""
    if value is None or value.strip() == "all":
        return tuple(known)
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise SelectionError(f"{option} is empty; name at least one of: {', '.join(map(str, known))}")
    by_text = {str(name): name for name in known}
    for name in names:
        if name not in by_text:
            raise SelectionError(
                f"unknown value {name!r} in {option}; expected a comma-separated list of: {', '.join(map(str, known))}"
            )
    return tuple(by_text[name] for name in names)


@dataclass(frozen=True)
class CellFilter:
    """The cells chosen on the command line."""

    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    world_sizes: tuple[str, ...]


def cells(selected: CellFilter) -> list[Cell]:
    """Every cell of the matrix that the filter selects, in a stable order."""
    return [
        Cell(device, precision, world_size)
        for device in DEVICE_KINDS
        if device in selected.devices
        for world_size in WORLD_SIZES
        if str(world_size) in selected.world_sizes
        for precision in PRECISIONS
        if precision in selected.precisions
    ]


def devices_found() -> list[str]:
    """The device kinds this machine can run."""
    found = ["cpu"]
    if torch.cuda.is_available():
        found.append("cuda")
    if importlib.util.find_spec("torch_xla") is not None:
        found.append("xla")
    return found


def start_xla_early() -> None:
    """Bring up the XLA device now: torch_xla's device cannot join autograd after a first CPU backward pass."""
    import torch_xla

    torch_xla.device()


def unavailable_reason(cell: Cell) -> str | None:
    """Why this machine cannot run a cell, or ``None`` when it can."""
    if cell.device == "cuda" and not torch.cuda.is_available():
        return "no CUDA device on this machine"
    if cell.device == "xla" and importlib.util.find_spec("torch_xla") is None:
        return "torch_xla is not installed"
    if cell.device == "cuda" and cell.world_size > max(torch.cuda.device_count(), 1):
        return f"world size {cell.world_size} needs {cell.world_size} CUDA devices"
    return None
