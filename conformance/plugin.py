"""The pytest plugin of the conformance suite: options, the implementation under test, cells, outcomes.

Loaded by ``conformance/conftest.py`` for ``pytest conformance --impl=...`` and by the
``lightning-optimizer-conformance`` script for an installed package. It is deliberately not an auto-loaded
``pytest11`` plugin: it would add ``--impl`` to every pytest run.
"""

from __future__ import annotations

import atexit
import os
import textwrap
from collections.abc import Callable, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from lightning_optimizer.conformance import html_report, isolation, report
from lightning_optimizer.conformance.dimensions import dimension_problems
from lightning_optimizer.conformance.harness import build_context
from lightning_optimizer.conformance.outcomes import NotApplicable, Unavailable
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.selection import (
    DEFAULT_IMPL,
    WORLD_SIZES,
    CellFilter,
    ExpectedFailure,
    LoadedImplementation,
    SelectionError,
    cells,
    devices_found,
    load_implementation,
    parse_list,
    parse_property_examples,
    read_expected_failures,
    required_devices,
    start_xla_early,
    unavailable_reason,
)
from lightning_optimizer.spec import (
    DEVICE_KINDS,
    PRECISIONS,
    REQUIREMENTS,
    STRATEGIES,
    Cell,
    ImplementationInfo,
    TrainingContext,
)

SPMD_SCENARIOS = "lightning_optimizer.conformance.spmd"
KEEP_POOLS = "LIGHTNING_OPTIMIZER_KEEP_RANK_POOLS"
IMPL_KEY = pytest.StashKey[LoadedImplementation]()
FILTER_KEY = pytest.StashKey[CellFilter]()
RESULTS_KEY = pytest.StashKey[dict[str, report.Result]]()
DECLARED_KEY = pytest.StashKey[list[ExpectedFailure]]()
"""Every declared deviation: the file's entries in file order, then the record's."""
REQUIRED_KEY = pytest.StashKey[tuple[str, ...]]()
MATCHED_KEY = pytest.StashKey[list[list[str]]]()
"""Per declared deviation, the node ids of the collected checks it names."""
COLLECTED_NAMES_KEY = pytest.StashKey[set[str]]()
EXERCISED_KEY = pytest.StashKey[set[str]]()
"""Node ids of the checks that ran (passed, failed, errored or deviated), as opposed to n/a or unavailable."""
RUN_KEY = pytest.StashKey[tuple[list[report.Declaration], list[str]]]()
"""The declared deviations with their staleness, and what fails the run as a whole."""
ENTRY_KEY = pytest.StashKey[ExpectedFailure]()
"""On an item: the declared deviation that applies to it."""
ORDER_KEY = pytest.StashKey[dict[str, int]]()
"""Node id: its place in the collection, the order of the reports' results (n/a ones are recorded first)."""
VERDICT_KEY = pytest.StashKey[Unavailable]()
"""On an item: why this machine cannot run it, decided at collection and raised when it would set up."""

ContextT = TypeVar("ContextT", bound=TrainingContext)


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
    group.addoption(
        "--strategies",
        default=None,
        help=f"comma-separated strategies ({', '.join(STRATEGIES)}; default all)",
    )
    group.addoption("--report-json", default=None, metavar="PATH", help="write the result matrix as JSON")
    group.addoption("--report-md", default=None, metavar="PATH", help="write the result matrix as Markdown")
    group.addoption(
        "--report-html",
        default=None,
        metavar="PATH",
        help="write the result matrix as one self-contained HTML page (no network, no scripts)",
    )
    group.addoption(
        "--matrix",
        default="summary",
        choices=report.MATRIX_CHOICES,
        help="what the terminal shows: per cell and per requirement group (summary, the default; 120 columns), "
        "or the per-check matrix too (full; as wide as the cells need)",
    )
    group.addoption(
        "--expected-failures-file",
        default=None,
        metavar="PATH",
        help="declared deviations, merged with the implementation's expected_failures: one 'ENTRY REASON' per "
        "line, ENTRY being check_name or check_name[pattern] ('*' matches anything), '#' starts a comment line. "
        "A declared check that fails reports 'deviation'; one that passes fails the run; entries that match no "
        "check that ran are reported as stale",
    )
    group.addoption(
        "--strict-expected-failures",
        action="store_true",
        default=False,
        help="fail the run when an expected-failure entry is stale (matches no check that ran)",
    )
    group.addoption(
        "--require-devices",
        default=None,
        metavar="DEVICES",
        help=f"comma-separated devices ({', '.join(DEVICE_KINDS)}) that must run: their 'unavailable' cells fail, "
        "and so does the run when no check ran on one of them (for GPU and TPU CI)",
    )
    group.addoption(
        "--property-examples",
        default=None,
        metavar="N",
        help="examples per property-based check, an integer >= 1 (default: each check's fixed CI budget)",
    )


MARKERS = (
    "requirement(*ids): the contract requirement ids that a conformance check verifies",
    "cells(devices=None, precisions=None, world_sizes=None, strategies=None): the cells where a conformance check "
    "applies (strategies default to none, ddp and spmd: every strategy but fsdp)",
    "features(*names): optional capabilities a conformance check needs",
    "varies(**dimensions): the values a conformance check tries along each dimension (see dimensions.DIMENSIONS)",
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
            strategies=parse_list("--strategies", config.getoption("strategies"), STRATEGIES),
        )
        config.option.property_examples = parse_property_examples(config.getoption("property_examples"))
        loaded = config.stash[IMPL_KEY] = load_implementation(config.getoption("impl"))
        path = config.getoption("expected_failures_file")
        from_file = read_expected_failures(path) if path else []
        config.stash[REQUIRED_KEY] = required_devices(
            config.getoption("require_devices"), config.stash[FILTER_KEY].devices, loaded.info
        )
    except SelectionError as exc:
        raise pytest.UsageError(str(exc)) from None
    config.stash[DECLARED_KEY] = [*from_file, *loaded.expected_failures]
    config.stash[EXERCISED_KEY] = set()
    if (
        "xla" in config.stash[FILTER_KEY].devices
        and "xla" in config.stash[IMPL_KEY].info.devices
        and "xla" in devices_found()
    ):
        start_xla_early()
    config.stash[RESULTS_KEY] = {}


def pytest_report_header(config: pytest.Config) -> list[str]:
    """Say what is under test, and where; what is declared to fail and which devices must run."""
    loaded = config.stash[IMPL_KEY]
    info = loaded.info
    env = report.environment()
    lines = [
        f"conformance: {info.name} {info.version} ({loaded.module}), contract {info.contract_version}",
        f"conformance: claims devices={sorted(info.devices)} precisions={sorted(info.precisions)} "
        f"world_sizes={sorted(info.world_sizes)} strategies={sorted(info.strategies)} features={sorted(info.features)}",
        f"conformance: torch {env['torch']}, torch_xla {env['torch_xla']}, devices found {env['devices_found']}",
    ]
    declared = config.stash[DECLARED_KEY]
    if declared:
        from_file = len(declared) - len(loaded.expected_failures)
        lines.append(
            f"conformance: expected failures: {len(loaded.expected_failures)} declared by the implementation, "
            f"{from_file} in {config.getoption('expected_failures_file') or 'no file'}"
        )
    required = config.stash[REQUIRED_KEY]
    if required:
        lines.append(f"conformance: required devices: {', '.join(required)}")
    examples: int | None = config.getoption("property_examples")
    if examples is not None:
        lines.append(f"conformance: property-based checks run {examples} examples each")
    return [part for line in lines for part in textwrap.wrap(line, report.TERMINAL_WIDTH, subsequent_indent="  ")]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Parametrise every check that takes ``cell`` over the selected cells."""
    if "cell" in metafunc.fixturenames:
        selected = cells(metafunc.config.stash[FILTER_KEY])
        metafunc.parametrize("cell", selected, ids=[cell.id for cell in selected])


def _verdict(item: pytest.Item, info: ImplementationInfo[Any], cell: Cell | None) -> NotApplicable | Unavailable | None:
    """Why a check does not run here (``NotApplicable`` or ``Unavailable``), or ``None`` when it runs."""
    needed = [name for marker in item.iter_markers("features") for name in marker.args]
    missing = sorted(set(needed) - info.features)
    if missing:
        return NotApplicable(f"not claimed (feature {', '.join(missing)})")
    applies = item.get_closest_marker("cells")
    scope = applies.kwargs if applies is not None else {}
    if cell is None:  # a check without a cell that names devices needs one of them claimed
        devices = scope.get("devices", DEVICE_KINDS)
        if not set(devices) & info.devices:
            return NotApplicable(f"not claimed (device {', '.join(devices)})")
        return None
    if cell.device not in scope.get("devices", DEVICE_KINDS) or cell.precision not in scope.get(
        "precisions", PRECISIONS
    ):
        return NotApplicable(f"the check does not apply to {cell.device} {cell.precision}")
    if cell.world_size not in scope.get("world_sizes", (1,)):
        return NotApplicable(f"the check does not apply to world size {cell.world_size}")
    if cell.strategy not in scope.get("strategies", ("none", "ddp", "spmd")):
        return NotApplicable(f"the check does not apply to strategy {cell.strategy}")
    if cell.device not in info.devices:
        return NotApplicable(f"not claimed (device {cell.device})")
    if cell.precision not in info.precisions:
        return NotApplicable(f"not claimed (precision {cell.precision})")
    if cell.world_size not in info.world_sizes:
        return NotApplicable(f"not claimed (world size {cell.world_size})")
    if cell.strategy not in info.strategies:
        return NotApplicable(f"not claimed (strategy {cell.strategy})")
    reason = unavailable_reason(cell)
    return None if reason is None else Unavailable(reason)


def _row_params(item: pytest.Item) -> str:
    """A check's parameter id without the cell's part (empty when the cell is its only parameter).

    pytest joins the ids of a check's parameters with ``-``; the cell's id is cut out as a whole, so the other
    parameters' ids keep every character (``-1`` stays ``-1``).
    """
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return ""
    full = str(callspec.id)
    cell = _cell_of(item)
    if cell is None:
        return full
    if full == cell.id:
        return ""
    if full.startswith(f"{cell.id}-"):
        return full[len(cell.id) + 1 :]
    if full.endswith(f"-{cell.id}"):
        return full[: -len(cell.id) - 1]
    return full.replace(f"-{cell.id}-", "-", 1)


def _function_name(item: pytest.Item) -> str:
    return str(getattr(item, "originalname", item.name))


def check_name(item: pytest.Item) -> str:
    """The row of a check in the matrix: its function name plus any parameters other than the cell."""
    params = _row_params(item)
    return f"{_function_name(item)}[{params}]" if params else _function_name(item)


def _ids(item: pytest.Item) -> list[str]:
    """The ids an expected-failure pattern is matched against: full parameter id, cell id, other parameters."""
    callspec = getattr(item, "callspec", None)
    if callspec is None:
        return []
    cell = _cell_of(item)
    return [str(callspec.id), *([cell.id] if cell is not None else []), *filter(None, [_row_params(item)])]


def _cell_of(item: pytest.Item) -> Cell | None:
    callspec = getattr(item, "callspec", None)
    cell = callspec.params.get("cell") if callspec is not None else None
    return cell if isinstance(cell, Cell) else None


@pytest.hookimpl(trylast=True)  # after -k and -m have deselected what the caller left out
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the checks that are n/a (recording them as such); mark the rest unavailable or a declared deviation.

    A check is n/a where it does not apply to its cell, or where the implementation does not claim the cell or a
    feature it needs: pytest reports it deselected, the matrix as ``n/a`` with its reason. Only the checks this
    machine cannot run are left to be reported as skips.
    """
    info = config.stash[IMPL_KEY].info
    declared = config.stash[DECLARED_KEY]
    matched: list[list[str]] = [[] for _ in declared]
    names: set[str] = set()
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    order = config.stash[ORDER_KEY] = {}
    for item in items:
        unknown = [rid for marker in item.iter_markers("requirement") for rid in marker.args if rid not in REQUIREMENTS]
        if unknown:
            raise pytest.UsageError(f"{item.nodeid} names unknown requirement ids: {', '.join(unknown)}")
        problems = [problem for marker in item.iter_markers("varies") for problem in dimension_problems(marker.kwargs)]
        if problems:
            raise pytest.UsageError(f"{item.nodeid}: its varies marker is wrong: {'; '.join(problems)}")
        name, ids = _function_name(item), _ids(item)
        names.add(name)
        applying = [i for i, entry in enumerate(declared) if entry.matches(name, ids)]
        for i in applying:
            matched[i].append(item.nodeid)
        verdict = _verdict(item, info, _cell_of(item))
        order[item.nodeid] = len(order)
        if isinstance(verdict, NotApplicable):
            result = _result(item)
            result.outcome, result.reason = "n/a", verdict.msg or ""
            deselected.append(item)
            continue
        if verdict is not None:
            item.stash[VERDICT_KEY] = verdict
        elif applying:
            entry = item.stash[ENTRY_KEY] = declared[applying[0]]
            deviation = f"declared deviation {entry.entry!r} ({entry.source}): {entry.reason}"
            item.add_marker(pytest.mark.xfail(reason=deviation, strict=True))
        kept.append(item)
    config.stash[MATCHED_KEY] = matched
    config.stash[COLLECTED_NAMES_KEY] = names
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


def _result(item: pytest.Item) -> report.Result:
    """The matrix's record of a check in its cell (made on first use)."""
    results = item.config.stash[RESULTS_KEY]
    result = results.get(item.nodeid)
    if result is None:
        cell = _cell_of(item)
        result = results[item.nodeid] = report.Result(
            check=check_name(item),
            requirements=[rid for marker in item.iter_markers("requirement") for rid in marker.args],
            device=None if cell is None else cell.device,
            precision=None if cell is None else cell.precision,
            world_size=None if cell is None else cell.world_size,
            strategy=None if cell is None else cell.strategy,
        )
    return result


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """A check that this machine cannot run stops before its fixtures, as ``unavailable``."""
    verdict = item.stash.get(VERDICT_KEY, None)
    if verdict is not None:
        raise verdict


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, Any, Any]:
    """Record one outcome per check and cell; a leak of global state and a required device's absence fail."""
    rep: pytest.TestReport = yield
    config = item.config
    cell = _cell_of(item)
    result = _result(item)
    result.duration_s += rep.duration
    leak = call.excinfo is not None and isinstance(call.excinfo.value, isolation.StateLeak)
    if leak and hasattr(rep, "wasxfail"):  # a declared deviation excuses the check's failure, not a leak
        rep.outcome = "failed"
        del rep.wasxfail
    outcome, reason = _classify(item, rep, call, str(call.excinfo.value) if leak and call.excinfo is not None else None)
    if outcome == "unavailable" and cell is not None and cell.device in config.stash[REQUIRED_KEY]:
        outcome, reason = "failed", f"device {cell.device} is required (--require-devices) but unavailable: {reason}"
        rep.outcome, rep.longrepr = "failed", reason
    elif outcome == "error" and rep.skipped:  # an untyped skip: an error of the matrix fails the run too
        rep.outcome, rep.longrepr = "failed", reason
        config.stash[EXERCISED_KEY].add(item.nodeid)
    elif outcome in ("passed", "deviation") or rep.failed:
        config.stash[EXERCISED_KEY].add(item.nodeid)
    if outcome is None:
        return rep
    if result.outcome in (None, "passed"):
        result.outcome, result.reason = outcome, reason
        if outcome == "deviation":  # the declared reason is the row's reason; keep what the check showed beside it
            result.observed = _failure_message(rep)
    elif leak:
        result.outcome = "failed" if result.outcome == "deviation" else result.outcome
        result.reason = f"{result.reason}; {reason}" if result.reason else reason
    return rep


def _classify(
    item: pytest.Item, rep: pytest.TestReport, call: pytest.CallInfo[None], leak: str | None
) -> tuple[str | None, str]:
    """The outcome and reason of one phase's report (``None``: the phase says nothing new)."""
    entry = item.stash.get(ENTRY_KEY, None)
    if leak is not None:
        return "failed", leak
    if hasattr(rep, "wasxfail"):
        if not rep.skipped:
            return None, ""
        return "deviation", entry.reason if entry is not None else str(rep.wasxfail)
    if rep.skipped:
        skipped = call.excinfo.value if call.excinfo is not None else None
        if isinstance(skipped, NotApplicable):
            return "n/a", skipped.msg or ""
        if isinstance(skipped, Unavailable):
            return "unavailable", skipped.msg or ""
        text = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        text = text.removeprefix("Skipped: ")
        return "error", (
            f"skipped without saying why it does not apply ({text}): raise outcomes.NotApplicable or "
            "outcomes.Unavailable instead of calling pytest.skip"
        )
    if rep.failed:
        if "[XPASS(strict)]" in rep.longreprtext and entry is not None:
            return "failed", (
                f"unexpected pass: the check passes, but {entry.entry!r} ({entry.source}) declares it a "
                f"deviation ({entry.reason}); remove that entry"
            )
        return ("failed" if rep.when == "call" else "error"), _failure_message(rep)
    if rep.when == "call":
        return "passed", ""
    return None, ""


def _failure_message(rep: pytest.TestReport) -> str:
    """What a failed phase raised: its exception's type and message (with any notes), else the report's last line.

    Also for a declared deviation: pytest reports it as an xfail, but keeps the failure's report.
    """
    crash = getattr(rep.longrepr, "reprcrash", None)
    message = crash.message if crash is not None else rep.longreprtext.strip().splitlines()[-1:]
    summary = message if isinstance(message, str) else "".join(message)
    return summary.strip()


def _declarations(config: pytest.Config) -> list[report.Declaration]:
    """Each declared deviation, stale when it names no check that ran, with why."""
    results, exercised = config.stash[RESULTS_KEY], config.stash[EXERCISED_KEY]
    names, matched = config.stash[COLLECTED_NAMES_KEY], config.stash[MATCHED_KEY]
    declared = config.stash[DECLARED_KEY]
    declarations = []
    for entry, nodeids in zip(declared, matched, strict=True):
        why = ""
        if entry.name not in names:
            why = f"no check named {entry.name} was collected (misspelt, removed, or not among the paths given)"
        elif not nodeids:
            why = f"no collected row or cell of {entry.name} matches it (its cells may be filtered out)"
        elif not any(nodeid in exercised for nodeid in nodeids):
            outcomes = sorted({results[n].outcome or "error" for n in nodeids if n in results} or {"deselected"})
            why = f"the checks it names did not run here ({', '.join(outcomes)})"
        declarations.append(report.Declaration(entry.entry, entry.reason, entry.source, bool(why), why))
    return declarations


def _vacuous_devices(config: pytest.Config) -> list[str]:
    """Required devices on which no check was even attempted (every one deselected or n/a)."""
    results = config.stash[RESULTS_KEY].values()
    return [
        device
        for device in config.stash[REQUIRED_KEY]
        if not any(result.device == device and result.outcome != "n/a" for result in results)
    ]


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run on stale declarations under ``--strict-expected-failures`` and on unexercised devices."""
    config = session.config
    if IMPL_KEY not in config.stash or MATCHED_KEY not in config.stash:
        return
    declarations = _declarations(config)
    failures = [
        f"required device {device}: no check ran on it (--require-devices); select some of its cells"
        for device in _vacuous_devices(config)
    ]
    stale = [d for d in declarations if d.stale]
    if stale and config.getoption("strict_expected_failures"):
        failures.append(f"{len(stale)} stale expected-failure entries (--strict-expected-failures)")
    config.stash[RUN_KEY] = (declarations, failures)
    if failures and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    """Print the matrix, with one line of reason per failed or erroring cell; write the reports asked for."""
    if IMPL_KEY not in config.stash:
        return
    order = config.stash.get(ORDER_KEY, {})
    recorded = config.stash.get(RESULTS_KEY, {})
    results = [recorded[nodeid] for nodeid in sorted(recorded, key=lambda nodeid: order.get(nodeid, len(order)))]
    loaded = config.stash[IMPL_KEY]
    declarations, failures = config.stash.get(RUN_KEY, ([], []))
    required = config.stash[REQUIRED_KEY]
    document = report.build(
        loaded.info, loaded.module, results, declarations=declarations, required_devices=required, run_failures=failures
    )
    terminalreporter.section("conformance matrix")
    matrix = config.getoption("matrix")
    lines = (
        report.render_terminal(document, matrix=matrix)
        if results
        else ["no check ran", *report.render_run_notes(document)]
    )
    for line in lines:
        terminalreporter.write_line(line)
    renderers = (
        ("report_json", report.to_json),
        ("report_md", report.to_markdown),
        ("report_html", html_report.render),
    )
    for option, render in renderers:
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
        return build_context(implementation.factory, cell, **kwargs)

    return make


_KEPT_POOLS: dict[tuple[str, int], RankPool] = {}
"""With ``LIGHTNING_OPTIMIZER_KEEP_RANK_POOLS=1``, the pools outlive the session, for the next session in this
interpreter (the suite's own meta-tests run one session per broken implementation); they stop at its exit."""


@pytest.fixture(scope="session")
def _rank_pools(pytestconfig: pytest.Config) -> Iterator[dict[tuple[str, int], RankPool]]:
    if os.environ.get(KEEP_POOLS) == "1":
        if not _KEPT_POOLS:
            atexit.register(_stop_kept_pools)
        for pool in _KEPT_POOLS.values():
            pool.impl = pytestconfig.getoption("impl")
        yield _KEPT_POOLS
        return
    pools: dict[tuple[str, int], RankPool] = {}
    yield pools
    for pool in pools.values():
        pool.stop()


def _stop_kept_pools() -> None:
    for pool in _KEPT_POOLS.values():
        pool.stop()


@pytest.fixture
def ranks(_rank_pools: dict[tuple[str, int], RankPool], pytestconfig: pytest.Config, cell: Cell) -> RankPool:
    """The session's process group for this cell's device and world size (started on first use).

    On XLA the pool is one process driving ``world_size`` devices under SPMD.
    """
    key = (cell.device, cell.world_size)
    if key not in _rank_pools:
        impl = pytestconfig.getoption("impl")
        if cell.device == "xla":  # several XLA devices: one process drives them all under SPMD
            _rank_pools[key] = RankPool(impl, "xla", 1, spmd_devices=cell.world_size, scenarios=SPMD_SCENARIOS)
        else:
            _rank_pools[key] = RankPool(impl, cell.device, cell.world_size)
    return _rank_pools[key]


@pytest.fixture(autouse=True)
def _isolate_torch_state() -> Iterator[None]:
    """Snapshot global torch state and the environment before each check; after it, restore them.

    A check that leaves any of them changed fails in teardown (:class:`~.isolation.StateLeak`), naming what
    leaked with its values before and after: the next cell would otherwise run in conditions it does not expect.
    """
    before = isolation.snapshot()
    yield
    leaks = isolation.restore(before)
    if leaks:
        raise isolation.StateLeak(leaks)
