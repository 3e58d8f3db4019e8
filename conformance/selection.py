"""Which implementation is under test, which cells run, why a cell does not run, and what is expected to fail.

Nothing here imports pytest: the plugin turns :class:`SelectionError` into a usage error.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import torch

from lightning_optimizer.spec import (
    CONTRACT_VERSION,
    DEVICE_KINDS,
    FEATURES,
    PRECISIONS,
    STRATEGIES,
    Cell,
    ImplementationInfo,
    Strategy,
)

__all__ = [
    "DEFAULT_IMPL",
    "KNOWN_CONTRACT_VERSIONS",
    "WORLD_SIZES",
    "CellFilter",
    "ExpectedFailure",
    "SelectionError",
    "cells",
    "declared_expected_failures",
    "devices_found",
    "load_implementation",
    "parse_expected_failure",
    "parse_list",
    "parse_property_examples",
    "read_expected_failures",
    "required_devices",
    "start_xla_early",
    "unavailable_reason",
]

DEFAULT_IMPL = "lightning_optimizer.reference"
KNOWN_CONTRACT_VERSIONS = frozenset({CONTRACT_VERSION})
WORLD_SIZES: tuple[int, ...] = (1, 2)

NameT = TypeVar("NameT", bound=str)


class SelectionError(ValueError):
    """Bad input to the suite: an unusable ``--impl``, an unknown name in a filter, a malformed declaration."""


@dataclass(frozen=True)
class ExpectedFailure:
    """One declared deviation: an entry naming checks, why the implementation fails them, where it is declared.

    ``entry`` is ``check_name`` (every row and cell of that check) or ``check_name[pattern]``, where the pattern
    (``*`` matches any run of characters) must match the whole of one of the check's ids: its full parameter
    id as pytest prints it (``cpu-32-true-ws1``), its cell id, or its parameters other than the cell. Build one
    with :func:`parse_expected_failure`.
    """

    entry: str
    reason: str
    source: str
    name: str
    pattern: re.Pattern[str] | None = field(default=None, compare=False)

    def matches(self, name: str, ids: Iterable[str]) -> bool:
        """Whether this entry names the check ``name`` whose ids are ``ids``."""
        if name != self.name:
            return False
        return self.pattern is None or any(self.pattern.fullmatch(id_) for id_ in ids)


_RECORD = "the implementation's expected_failures"
"""The source of the deviations an implementation record declares."""

_ENTRY = re.compile(r"(?P<name>[A-Za-z_]\w*)(?:\[(?P<params>[^\[\]\s]+)\])?")


def _entry_problem(entry: str) -> str | None:
    """What is wrong with an entry's syntax, or ``None``."""
    if _ENTRY.fullmatch(entry):
        return None
    name = entry.partition("[")[0]
    if not re.fullmatch(r"[A-Za-z_]\w*", name):
        return f"{name!r} is not a check name (a function name such as test_true_steps_now)"
    rest = entry[len(name) :]
    inner = rest[1:-1]
    if not rest.endswith("]") or "[" in inner or "]" in inner:
        return f"{entry!r} must be check_name or check_name[pattern], with one pair of brackets at the end"
    if not inner:
        return f"{entry!r} has empty brackets: name a cell or parameter id, or leave the brackets out"
    return f"{entry!r}: the pattern in brackets must not contain whitespace"


def parse_expected_failure(entry: str, reason: str, source: str, *, context: str | None = None) -> ExpectedFailure:
    """Validate an entry and its reason, declared at ``source``; raise :class:`SelectionError` saying what is wrong.

    The error starts with ``context`` (default: ``source``).
    """
    where = source if context is None else context
    problem = _entry_problem(entry)
    if problem is not None:
        raise SelectionError(f"{where}: {problem}")
    if not reason.strip():
        raise SelectionError(f"{where}: {entry!r} gives no reason; say why the implementation fails it")
    match = _ENTRY.fullmatch(entry)
    assert match is not None
    params = match["params"]
    pattern = None if params is None else re.compile(".*".join(re.escape(part) for part in params.split("*")))
    return ExpectedFailure(entry, reason.strip(), source, match["name"], pattern)


def read_expected_failures(path: str) -> list[ExpectedFailure]:
    """Read an expected-failures file: per line ``ENTRY REASON``; blank lines and ``#`` comment lines are skipped.

    A malformed line, a repeated entry or an unreadable file raises :class:`SelectionError` naming the file and
    the line.
    """
    option = f"--expected-failures-file={path}"
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SelectionError(f"{option}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SelectionError(f"{option}: cannot be read: {exc}") from None
    entries: list[ExpectedFailure] = []
    seen: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        context = f"{option}, line {number}"
        entry, *rest = stripped.split(None, 1)
        reason = rest[0] if rest else ""
        if reason.startswith("["):
            bracket = reason.split()[0]
            raise SelectionError(f"{context}: a space between {entry!r} and {bracket!r}; write {entry}{bracket}")
        if entry in seen:
            raise SelectionError(f"{context}: {entry!r} is already declared on line {seen[entry]}")
        entries.append(parse_expected_failure(entry, reason, f"{path}:{number}", context=context))
        seen[entry] = number
    return entries


def declared_expected_failures(info: ImplementationInfo[Any], spec: str) -> list[ExpectedFailure]:
    """The deviations an implementation record declares in ``expected_failures``, validated."""
    declared: list[ExpectedFailure] = []
    items: list[tuple[object, object]] = list(info.expected_failures.items())
    for entry, reason in items:
        context = f"--impl={spec}: expected_failures entry {entry!r}"
        if not isinstance(entry, str) or not isinstance(reason, str):
            raise SelectionError(f"{context}: entries and reasons must be strings")
        declared.append(parse_expected_failure(entry, reason, _RECORD, context=context))
    return declared


@dataclass(frozen=True)
class LoadedImplementation:
    """An implementation record and where it came from, with its declared deviations."""

    info: ImplementationInfo[Any]
    module: str
    expected_failures: tuple[ExpectedFailure, ...] = ()


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
    return LoadedImplementation(info, module_name, tuple(declared_expected_failures(info, spec)))


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
    unknown("strategies", info.strategies, STRATEGIES)
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


def required_devices(value: str | None, devices: Sequence[str], info: ImplementationInfo[Any]) -> tuple[str, ...]:
    """Parse ``--require-devices``: known names that ``--devices`` selects and the implementation claims."""
    if value is None:
        return ()
    required: tuple[str, ...] = parse_list("--require-devices", value, DEVICE_KINDS)
    for device in required:
        if device not in devices:
            raise SelectionError(
                f"--require-devices names {device}, which --devices={','.join(devices)} leaves out; "
                f"add it to --devices or drop it from --require-devices"
            )
        if device not in info.devices:
            raise SelectionError(
                f"--require-devices names {device}, which {info.name!r} does not claim (it claims "
                f"{', '.join(sorted(info.devices))}): a required device must be one the implementation runs on"
            )
    return required


def parse_property_examples(value: str | None) -> int | None:
    """Parse ``--property-examples``: an integer >= 1, or ``None`` for each property check's own budget."""
    if value is None:
        return None
    if not re.fullmatch(r"\s*[+-]?\d+\s*", value):
        raise SelectionError(f"--property-examples={value}: not an integer; give a number of examples >= 1")
    number = int(value)
    if number < 1:
        raise SelectionError(f"--property-examples={value}: must be at least 1")
    return number


@dataclass(frozen=True)
class CellFilter:
    """The cells chosen on the command line."""

    devices: tuple[str, ...]
    precisions: tuple[str, ...]
    world_sizes: tuple[str, ...]
    strategies: tuple[str, ...] = STRATEGIES


def _strategies_at(device: str, world_size: int) -> tuple[Strategy, ...]:
    if world_size == 1:
        return ("none",)
    return ("spmd",) if device == "xla" else ("ddp", "fsdp")


def cells(selected: CellFilter) -> list[Cell]:
    """Every cell of the matrix that the filter selects, in a stable order."""
    return [
        Cell(device, precision, world_size, strategy)
        for device in DEVICE_KINDS
        if device in selected.devices
        for world_size in WORLD_SIZES
        if str(world_size) in selected.world_sizes
        for strategy in _strategies_at(device, world_size)
        if strategy in selected.strategies
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
    if cell.device == "xla" and cell.precision == "16-true" and _xla_backend() == "CPU":
        return (
            "torch_xla's CPU backend (PJRT_DEVICE=CPU) is no place for float16 graphs: after the 16-true cells' "
            "graphs, a later XLA computation in the same process ends in a segmentation fault (torch_xla 2.9)"
        )
    return None


def _xla_backend() -> str:
    """The device type of torch_xla's runtime (``CPU``, ``TPU``, ``CUDA``, ...); torch_xla is installed."""
    import torch_xla.runtime as xr

    return str(xr.device_type())
