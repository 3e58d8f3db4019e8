"""Property checks: generated training schedules against the plain-PyTorch schedule oracle.

Hypothesis generates whole loops (:class:`~lightning_optimizer.conformance.schedule_oracle.Schedule`): one to
three optimizers of every kind the oracle knows (SGD, with momentum, foreach and fused variants, Adam, AdamW), one
or two parameter groups with other hyper-parameters, parameters the forward pass never uses and parameters frozen
before wrapping; ``accumulate_grad_batches`` 1 to 4; configured clipping by norm or by value; under 16-mixed,
loss-scaler settings (given to the factory) that make the scale grow within a few iterations, and injected
non-finite losses that make it back off; epochs whose length leaves partial windows, and iterations outside any
``context.batch`` (where, under 16-mixed, the scaler updates after each real step); per call
``make_optimizer_step`` ``True``/``False``/``None``, the closure form (``wrapper.backward`` or ``loss.backward()``)
or the backward-then-step form, ``zero_grad()`` with ``set_to_none`` either way; ``zero_grad_after_step`` ``True``
or, for an implementation that claims ``"user_zero_grad"``, ``False`` (windows then carry what the last real step
left, wherever no ``zero_grad()`` came first); between iterations parameters
frozen and unfrozen after wrap, parameter groups added after wrap, copies of the whole training state (pickle,
deepcopy) that go on while the original must stay as it was, closures that raise, and checkpoints resumed in fresh
objects.

After every call the implementation's outcome, every wrapper's ``last_outcome`` and every parameter's gradient (the
open windows') must be the oracle's; after every iteration its parameters, gradients and loss scales; at the end
its optimizer state and loss-scaler state. The closure runs once per call, under the context's autocast.

The suite runs a fixed, derandomised budget per cell (``CI_EXAMPLES``; ``--property-examples=N`` runs ``N``
schedules per check, and shrinks a failing one to a minimal example). The checks run on the eager devices at
world size 1: on XLA every generated schedule compiles new graphs (minutes per cell), and the DDP ranks run in
the rank pool's processes, where the DDP checks cover what world size 2 adds (``no_sync``, identical ranks).
``GENERATED`` is what the generator draws (the checks' ``varies`` marker); ``tests/test_dimensions.py`` checks that
the CI budget reaches every value of it.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from typing import Any

import pytest

from lightning_optimizer.conformance.assertions import assert_same_values
from lightning_optimizer.conformance.harness import ON_FAILURE
from lightning_optimizer.conformance.outcomes import unavailable
from lightning_optimizer.conformance.ranks import RankPool
from lightning_optimizer.conformance.schedule_generator import (
    FAULTS_GENERATED,
    GENERATED,
    HYPOTHESIS_MISSING,
    RANK_GENERATED,
    RESUME_GENERATED,
    quiet_process_state,
    schedules_of,
)
from lightning_optimizer.conformance.schedule_oracle import Schedule
from lightning_optimizer.conformance.schedule_runner import Run, assert_matches, oracle_run, run_schedule
from lightning_optimizer.spec import Cell, FailurePolicy, TrainingContext

MakeContext = Callable[..., TrainingContext]
EAGER = ("cpu", "cuda")


def _check_schedules(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    cell: Cell,
    budget: str,
    check: Callable[[Schedule], object],
    **kinds: bool,
) -> None:
    """Run ``check`` on the explicit schedules, then on generated ones (derandomised, no example database)."""
    if HYPOTHESIS_MISSING is not None:
        unavailable(HYPOTHESIS_MISSING)
    requested = request.config.getoption("property_examples", default=None)
    with quiet_process_state(tmp_path_factory.getbasetemp() / "hypothesis"):
        schedules_of(cell, budget, requested, run=check, **kinds)


def _run_schedule(
    make_context: MakeContext, cell: Cell, schedule: Schedule, on_failure: FailurePolicy = "discard"
) -> Run:
    """Run ``schedule`` on the implementation, then hold the run to the oracle's."""
    want, plan = oracle_run(schedule, cell, on_failure)
    got = run_schedule(make_context, schedule, cell, plan, on_failure)
    assert_matches([got], want, schedule, cell)
    return got


# -- the checks ----------------------------------------------------------------------------------------------


@pytest.mark.requirement(
    "STEP-001",
    "STEP-002",
    "STEP-003",
    "STEP-004",
    "ACC-001",
    "ACC-002",
    "ACC-003",
    "ZERO-001",
    "ZERO-002",
    "ZERO-004",
    "ZERO-005",
    "CLOS-001",
    "TOGGLE-001",
    "TOGGLE-002",
    "PROXY-003",
    "CLIP-001",
    "AMP-002",
    "AMP-003",
    "AMP-004",
    "AMP-006",
    "PICKLE-001",
)
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(**GENERATED)
def test_generated_schedules_match_the_oracle(
    make_context: MakeContext,
    cell: Cell,
    implementation: Any,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Generated schedules: outcomes and gradients after every call, parameters and scales after every iteration."""
    copies, leaves = "pickling" in implementation.features, "user_zero_grad" in implementation.features
    check = functools.partial(_run_schedule, make_context, cell)
    _check_schedules(request, tmp_path_factory, cell, "oracle", check, copies=copies, user_zero_grad=leaves)


@pytest.mark.requirement("CLOS-003", "TOGGLE-002", "FAIL-002", "FAIL-003", "FAIL-004", "STEP-004", "ZERO-007")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.parametrize("on_failure", ON_FAILURE)
@pytest.mark.varies(**FAULTS_GENERATED)
def test_generated_schedules_with_raising_closures(
    make_context: MakeContext,
    cell: Cell,
    implementation: Any,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    on_failure: FailurePolicy,
) -> None:
    """A call whose closure (or ``toggle_model`` block) raises; the schedule then goes on with its retry.

    Raised before its backward, the call changes nothing under either policy. Raised after it, nothing under
    ``"restore"``; under ``"discard"`` the oracle discards that optimizer's window (``DISCARDED`` until the retry,
    which starts a new window) and every other window is untouched.
    """
    copies, leaves = "pickling" in implementation.features, "user_zero_grad" in implementation.features
    check = functools.partial(_run_schedule, make_context, cell, on_failure=on_failure)
    _check_schedules(
        request, tmp_path_factory, cell, "faults", check, faults=True, copies=copies, user_zero_grad=leaves
    )


@pytest.mark.requirement("CKPT-001", "CKPT-002", "PROXY-003", "ZERO-007")
@pytest.mark.features("checkpointing")
@pytest.mark.cells(devices=EAGER)
@pytest.mark.varies(**RESUME_GENERATED)
def test_generated_schedules_resume_from_checkpoints(
    make_context: MakeContext,
    cell: Cell,
    implementation: Any,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Checkpoints resumed between iterations in fresh objects: the oracle's trajectory, bit for bit the same."""

    def check(schedule: Schedule) -> None:
        resumed = _run_schedule(make_context, cell, schedule)
        uninterrupted = _run_schedule(make_context, cell, dataclasses.replace(schedule, resume_after=frozenset()))
        for index, (got, want) in enumerate(zip(resumed.iterations, uninterrupted.iterations, strict=True)):
            what = f"iteration {index} after resuming at iterations {sorted(schedule.resume_after)}"
            assert_same_values(got.params, want.params, f"{what}, against the uninterrupted run")

    leaves = "user_zero_grad" in implementation.features
    _check_schedules(request, tmp_path_factory, cell, "resume", check, resumes=True, user_zero_grad=leaves)


@pytest.mark.requirement(
    "DDP-001",
    "DDP-002",
    "FSDP-002",
    "FSDP-003",
    "FSDP-004",
    "STEP-001",
    "STEP-002",
    "STEP-003",
    "STEP-004",
    "ACC-001",
    "ACC-003",
    "ZERO-001",
    "ZERO-002",
    "ZERO-004",
    "ZERO-005",
    "TOGGLE-001",
    "CLIP-001",
    "AMP-002",
    "AMP-003",
    "AMP-004",
)
@pytest.mark.cells(devices=EAGER, world_sizes=(2,), strategies=("ddp", "fsdp"))
@pytest.mark.varies(**RANK_GENERATED)
def test_generated_schedules_on_ranks_match_the_global_batch(
    ranks: RankPool,
    cell: Cell,
    implementation: Any,
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Generated schedules on two ranks, each head its own prepared module: the plain loop on the global batch."""

    def check(schedule: Schedule) -> None:
        want, plan = oracle_run(schedule, cell)
        scenario = "lightning_optimizer.conformance.rank_schedules:run_on_rank"
        assert_matches(ranks.run(scenario, cell, schedule=schedule, plan=plan), want, schedule, cell)

    leaves = "user_zero_grad" in implementation.features
    _check_schedules(request, tmp_path_factory, cell, "ranks", check, ranks=True, user_zero_grad=leaves)
