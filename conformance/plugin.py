"""The pytest plugin of the conformance suite: options, the implementation under test, cells, outcomes.

Loaded by ``conformance/conftest.py`` for ``pytest conformance --impl=...`` and by the
``lightning-optimizer-conformance`` script for an installed package. It is deliberately not an auto-loaded
``pytest11`` plugin: it would add ``--impl`` to every pytest run.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import torch

from lightning_optimizer.conformance import report
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.selection import (
    DEFAULT_IMPL,
    WORLD_SIZES,
    CellFilter,
    LoadedImplementation,
    SelectionError,
    cells,
    devices_found,
    load_implementation,
    parse_list,
    start_xla_early,
    unavailable_reason,
)
from lightning_optimizer.spec import (
    DEVICE_KINDS,
    PRECISIONS,
    REQUIREMENTS,
    Cell,
    ImplementationInfo,
    TrainingContext,
)

IMPL_KEY = pytest.StashKey[LoadedImplementation]()
FILTER_KEY = pytest.StashKey[CellFilter]()
RESULTS_KEY = pytest.StashKey[dict[str, report.Result]]()

ContextT = TypeVar("ContextT", bound=TrainingContext)

NA = "n/a: "
UNAVAILABLE = "unavailable: "


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register the suite's options."""
    group = parser.getgroup("conformance", "lightning-optimizer conformance suite")
    group.addoption(
        "--impl",
        default=os.environ.get("LIGHTNING_OPTIMIZER_IMPL", DEFAULT_IMPL),
        help="implementation under test: module[:attr] exposing conformance_info() (default: %(default)s; "
        "environment: LIGHTNING_OPTIMIZER_IMPL)",
    )
    group.addoption("--devices", default=None, help=f"comma-separated devices ({', '.join(DEVICE_KINDS)}; default all)")
    group.addoption(
        "--precisions",
        default=None,
        help=f"comma-separated precisions ({', '.join(PRECISIONS)}; default all)",
    )
    group.addoption(
        "--world-sizes",
        default=None,
        help=f"comma-separated world sizes ({', '.join(map(str, WORLD_SIZES))})",
    )
    group.addoption("--report-json", default=None, metavar="PATH", help="write the result matrix as JSON")
    group.addoption("--report-md", default=None, metavar="PATH", help="write the result matrix as Markdown")


MARKERS = (
    "requirement(*ids): the contract requirement ids that a conformance check verifies",
    "cells(devices=None, precisions=None, world_sizes=None): the cells where a conformance check applies",
    "features(*names): optional capabilities a conformance check needs",
)


def pytest_configure(config: pytest.Config) -> None:
    """Register the markers; load and validate the implementation and the filters (bad input: usage error)."""
    for marker in MARKERS:
        config.addinivalue_line("markers", marker)
    try:
        config.stash[FILTER_KEY] = CellFilter(
            devices=parse_list("--devices", config.getoption("devices"), DEVICE_KINDS),
            precisions=parse_list("--precisions", config.getoption("precisions"), PRECISIONS),
            world_sizes=parse_list("--world-sizes", config.getoption("world_sizes"), tuple(map(str, WORLD_SIZES))),
        )
        config.stash[IMPL_KEY] = load_implementation(config.getoption("impl"))
    except SelectionError as exc:
        raise pytest.UsageError(str(exc)) from None
    if (
        "xla" in config.stash[FILTER_KEY].devices
        and "xla" in config.stash[IMPL_KEY].info.devices
        and "xla" in devices_found()
    ):
        start_xla_early()
    config.stash[RESULTS_KEY] = {}


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say what is under test, and where."""
    loaded = config.stash[IMPL_KEY]
    info = loaded.info
    env = report.environment()
    return [
        f"conformance: {info.name} {info.version} ({loaded.module}), contract {info.contract_version}",
        f"conformance: claims devices={sorted(info.devices)} precisions={sorted(info.precisions)} "
        f"world_sizes={sorted(info.world_sizes)} features={sorted(info.features)}",
        f"conformance: torch {env['torch']}, torch_xla {env['torch_xla']}, devices found {env['devices_found']}",
    ]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every check that takes ``cell`` over the selected cells."""
    if "cell" in metafunc.fixturenames:
        selected = cells(metafunc.config.stash[FILTER_KEY])
        metafunc.parametrize("cell", selected, ids=[cell.id for cell in selected])


def _verdict(item: pytest.Item, info: ImplementationInfo[Any], cell: Cell | None) -> str | None:
    """Why a check does not run here (``n/a: ...`` or ``unavailable: ...``), or ``None`` when it runs."""
    needed = [name for marker in item.iter_markers("features") for name in marker.args]
    missing = sorted(set(needed) - info.features)
    if missing:
        return f"{NA}not claimed (feature {', '.join(missing)})"
    if cell is None:
        return None
    applies = item.get_closest_marker("cells")
    scope = applies.kwargs if applies is not None else {}
    if cell.device not in scope.get("devices", DEVICE_KINDS) or cell.precision not in scope.get(
        "precisions", PRECISIONS
    ):
        return f"{NA}the check does not apply to {cell.device} {cell.precision}"
    if cell.world_size not in scope.get("world_sizes", (1,)):
        return f"{NA}the check does not apply to world size {cell.world_size}"
    if cell.device not in info.devices:
        return f"{NA}not claimed (device {cell.device})"
    if cell.precision not in info.precisions:
        return f"{NA}not claimed (precision {cell.precision})"
    if cell.world_size not in info.world_sizes:
        return f"{NA}not claimed (world size {cell.world_size})"
    reason = unavailable_reason(cell)
    return None if reason is None else UNAVAILABLE + reason


def check_name(item: pytest.Item) -> str:
    """The row of a check in the matrix: its function name plus any parameters other than the cell."""
    name = getattr(item, "originalname", item.name)
    cell = _cell_of(item)
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return name
    # pytest's own parameter id, without the cell's part: stable across runs, unlike repr() of a value.
    parts = [part for part in callspec.id.split("-") if part]
    if cell is not None:
        cell_parts = cell.id.split("-")
        for i in range(len(parts) - len(cell_parts) + 1):
            if parts[i : i + len(cell_parts)] == cell_parts:
                parts = parts[:i] + parts[i + len(cell_parts) :]
                break
    return f"{name}[{'-'.join(parts)}]" if parts else name


def _cell_of(item: pytest.Item) -> Cell | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("cell") if callspec is not None else None
    return cell if isinstance(cell, Cell) else None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each collected check as n/a, unavailable or a declared deviation."""
    info = config.stash[IMPL_KEY].info
    for item in items:
        unknown = [rid for marker in item.iter_markers("requirement") for rid in marker.args if rid not in REQUIREMENTS]
        if unknown:
            raise pytest.UsageError(f"{item.nodeid} names unknown requirement ids: {', '.join(unknown)}")
        reason = _verdict(item, info, _cell_of(item))
        if reason is not None:
            item.add_marker(pytest.mark.skip(reason=reason))
            continue
        for key in (item.name, check_name(item)):
            if key in info.expected_failures:
                item.add_marker(pytest.mark.xfail(reason=f"deviation: {info.expected_failures[key]}", strict=True))
                break


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Record one outcome per check and cell."""
    rep: pytest.TestReport = yield
    results = item.config.stash[RESULTS_KEY]
    cell = _cell_of(item)
    result = results.get(item.nodeid)
    if result is None:
        result = results[item.nodeid] = report.Result(
            check=check_name(item),
            requirements=[rid for marker in item.iter_markers("requirement") for rid in marker.args],
            device=None if cell is None else cell.device,
            precision=None if cell is None else cell.precision,
            world_size=None if cell is None else cell.world_size,
        )
    result.duration_s += rep.duration
    outcome, reason = _classify(rep)
    if outcome is not None and result.outcome in (None, "passed"):
        result.outcome, result.reason = outcome, reason
    return rep


def _classify(rep: pytest.TestReport) -> tuple[str | None, str]:
    if hasattr(rep, "wasxfail"):
        return ("deviation", str(rep.wasxfail).removeprefix("deviation: ")) if rep.skipped else (None, "")
    if rep.skipped:
        text = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        text = text.removeprefix("Skipped: ")
        if text.startswith(NA):
            return "n/a", text.removeprefix(NA)
        if text.startswith(UNAVAILABLE):
            return "unavailable", text.removeprefix(UNAVAILABLE)
        return "error", f"skipped without saying why it does not apply: {text}"
    if rep.failed:
        if "[XPASS(strict)]" in rep.longreprtext:
            return "failed", "unexpected pass of a declared deviation: remove it from expected_failures"
        crash = getattr(rep.longrepr, "reprcrash", None)
        message = crash.message if crash is not None else rep.longreprtext.strip().splitlines()[-1:]
        summary = message if isinstance(message, str) else "".join(message)
        return ("failed" if rep.when == "call" else "error"), summary.strip()
    if rep.when == "call":
        return "passed", ""
    return None, ""


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the matrix and write the reports that were asked for."""
    results = list(config.stash.get(RESULTS_KEY, {}).values())
    if IMPL_KEY not in config.stash:
        return
    loaded = config.stash[IMPL_KEY]
    document = report.build(loaded.info, loaded.module, results)
    terminalreporter.section("conformance matrix")
    for line in report.render_terminal(document) if results else ["no check ran"]:
        terminalreporter.write_line(line)
    for option, render in (("report_json", report.to_json), ("report_md", report.to_markdown)):
        path = config.getoption(option)
        if path:
            target = Path(path)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(render(document), encoding="utf-8")
            terminalreporter.write_line(f"conformance report written to {target}")


# -- fixtures the checks use ---------------------------------------------------------------------------


@pytest.fixture
def implementation(pytestconfig: pytest.Config) -> ImplementationInfo[Any]:
    """The implementation under test."""
    return pytestconfig.stash[IMPL_KEY].info


@pytest.fixture
def make_context(implementation: ImplementationInfo[ContextT], cell: Cell) -> Callable[..., ContextT]:
    """Build a training context of the implementation for this check's cell."""

    def make(**kwargs: Any) -> ContextT:
        return implementation.factory(cell, **kwargs)

    return make


@pytest.fixture(scope="session")
def _rank_pools(pytestconfig: pytest.Config) -> Iterator[dict[tuple[str, int], RankPool]]:
    pools: dict[tuple[str, int], RankPool] = {}
    yield pools
    for pool in pools.values():
        pool.stop()


@pytest.fixture
def ranks(_rank_pools: dict[tuple[str, int], RankPool], pytestconfig: pytest.Config, cell: Cell) -> RankPool:
    """The session's process group for this cell's device and world size (started on first use)."""
    key = (cell.device, cell.world_size)
    if key not in _rank_pools:
        _rank_pools[key] = RankPool(pytestconfig.getoption("impl"), cell.device, cell.world_size)
    return _rank_pools[key]


@pytest.fixture(autouse=True)
def _isolate_torch_state() -> Iterator[None]:
    """Give each check the default global torch state, and put it back afterwards."""
    dtype, grad = torch.get_default_dtype(), torch.is_grad_enabled()
    yield
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(grad)
