"""The dimension table (``docs/dimensions.md``) is generated from the suite, and the generators reach what they claim.

Each check declares with ``@pytest.mark.varies`` what it tries along each dimension; the table is rendered from
those markers. For the property checks the declaration is the generator's: their fixed CI budget, run through the
plain-PyTorch schedule oracle alone (no implementation), must exercise every declared value on the CPU cells.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lightning_optimizer.conformance import schedule_generator as generator
from lightning_optimizer.conformance.dimensions import DIMENSIONS, collect, dimension_problems, render_markdown
from lightning_optimizer.conformance.schedule_oracle import ScheduleOracle
from lightning_optimizer.spec import PRECISIONS, REQUIREMENTS, Cell, FailurePolicy

REPO = Path(__file__).resolve().parents[1]
TABLE = REPO / "docs" / "dimensions.md"

PROPERTY_CHECKS: dict[
    str, tuple[str, dict[str, tuple[str, ...]], bool, bool, bool, tuple[FailurePolicy, ...], bool]
] = {
    # check: (budget, what its generator draws, faults, resumes, copies, the failure policies it runs under, ranks)
    "test_generated_schedules_match_the_oracle": (
        "oracle",
        generator.GENERATED,
        False,
        False,
        True,
        ("discard",),
        False,
    ),
    "test_generated_schedules_with_raising_closures": (
        "faults",
        generator.FAULTS_GENERATED,
        True,
        False,
        True,
        ("discard", "restore"),
        False,
    ),
    "test_generated_schedules_resume_from_checkpoints": (
        "resume",
        generator.RESUME_GENERATED,
        False,
        True,
        False,
        ("discard",),
        False,
    ),
    "test_generated_schedules_on_ranks_match_the_global_batch": (
        "ranks",
        generator.RANK_GENERATED,
        False,
        False,
        False,
        ("discard",),
        True,
    ),
}


def test_the_table_is_current() -> None:
    """``docs/dimensions.md`` is what the checks' markers render today (``make dimensions`` rewrites it)."""
    want = render_markdown(collect())
    got = TABLE.read_text(encoding="utf-8") if TABLE.is_file() else ""
    assert got == want, "docs/dimensions.md is stale: run `make dimensions` and commit the result"


def test_every_check_declares_what_it_varies() -> None:
    """Every check names its requirements and declares its dimensions, in the vocabulary."""
    checks = collect()
    assert checks, "no checks collected"
    missing = [check.name for check in checks if not check.varies]
    assert not missing, f"checks without a varies marker: {missing}"
    unnamed = [check.name for check in checks if not check.requirements]
    assert not unnamed, f"checks that name no requirement: {unnamed}"
    for check in checks:
        problems = dimension_problems(check.varies)
        assert not problems, f"{check.name}: {problems}"


def test_every_requirement_is_checked_along_some_dimension() -> None:
    """Each requirement id has a check, and its table row names at least one dimension beyond the cells."""
    checks = collect()
    for rule_id in REQUIREMENTS:
        mine = [check for check in checks if rule_id in check.requirements]
        assert mine, f"{rule_id}: no check"
        assert any(check.varies for check in mine), f"{rule_id}: no check declares what it varies"


def test_the_property_checks_declare_their_generators() -> None:
    """The property checks' markers are their generators' declarations, in the vocabulary."""
    checks = {check.name: check for check in collect(["test_properties"])}
    for name, (_, generated, *_flags) in PROPERTY_CHECKS.items():
        assert not dimension_problems(generated), dimension_problems(generated)
        assert checks[name].varies == {key: tuple(values) for key, values in generated.items()}, name


@pytest.mark.skipif(generator.HYPOTHESIS_MISSING is not None, reason="hypothesis is not installed")
@pytest.mark.parametrize("check", sorted(PROPERTY_CHECKS))
def test_the_ci_budget_reaches_every_declared_value(check: str) -> None:
    """Over the CPU cells, the fixed CI budget's schedules exercise every value the check declares, in the oracle."""
    budget, generated, faults, resumes, copies, policies, ranks = PROPERTY_CHECKS[check]
    reached: set[tuple[str, str]] = set()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for precision in PRECISIONS:
            cell = Cell("cpu", precision)
            drawn = generator.schedules_of(
                cell, budget, None, faults=faults, resumes=resumes, copies=copies, ranks=ranks, user_zero_grad=True
            )
            for schedule in drawn:
                for policy in policies:
                    oracle = ScheduleOracle(schedule, cell, policy)
                    for position in schedule.iterations():
                        oracle.iteration(position)
                    reached |= oracle.facts
    finally:
        torch.set_num_threads(threads)
    declared = {(dimension, value) for dimension, values in generated.items() for value in values}
    unknown = {(dimension, value) for dimension, value in reached if value not in DIMENSIONS.get(dimension, ())}
    assert not unknown, f"the oracle records values outside the vocabulary: {sorted(unknown)}"
    assert declared <= reached, f"{check} declares values its CI budget never reaches: {sorted(declared - reached)}"
    undeclared = {(d, v) for d, v in reached if d in generated} - declared
    assert not undeclared, f"{check}'s CI budget reaches values it does not declare: {sorted(undeclared)}"
