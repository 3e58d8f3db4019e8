"""What a mutant declares: the requirement it breaks, the checks that must catch it, where they run, who wrote it.

Every mutant module declares one ``MUTANT = Mutant(...)`` from the names here alone. ``tests/test_mutants.py``
reads that declaration from the module's source and evaluates it against this module's names (``__all__``): it does
not import the module, so collecting the meta-tests imports no mutant, and no torch_xla.

A check is a function name of the suite (every row of it must fail) or ``name[params]`` (that row only). The named
cells below are the ones the mutants use; a mutant that needs another combination builds its own :class:`Cells`.
"""

from __future__ import annotations

import importlib.util
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

__all__ = [
    "BF16_MIXED",
    "BF16_TRUE",
    "BLIND_BATCHES",
    "DDP",
    "DEFAULT",
    "F16",
    "F16_TRUE",
    "F64",
    "FAULT_PROPERTY",
    "FSDP",
    "FSDP_F16",
    "HAS_TORCH_XLA",
    "MIXED",
    "ORACLE_PROPERTY",
    "PROPERTY_CHECKS",
    "RANK_PROPERTY",
    "RESUME_PROPERTY",
    "WITHOUT_TORCH_XLA",
    "XLA",
    "XLA_F16",
    "XLA_SPMD",
    "Cells",
    "Mutant",
]

HAS_TORCH_XLA = importlib.util.find_spec("torch_xla") is not None


@dataclass(frozen=True)
class Cells:
    """Where a mutant runs: the suite's cell filters (comma-separated lists) and what it needs of torch_xla.

    ``torch_xla``: ``True`` when the run needs torch_xla (implied by the xla device), ``False`` when it needs
    torch_xla to be missing (a check of its absence), ``None`` when it does not matter.
    """

    devices: str = "cpu"
    precisions: str = "32-true"
    world_sizes: str = "1"
    torch_xla: bool | None = None
    strategies: str = "none,ddp,spmd"

    @property
    def filters(self) -> tuple[str, ...]:
        return (
            f"--devices={self.devices}",
            f"--precisions={self.precisions}",
            f"--world-sizes={self.world_sizes}",
            f"--strategies={self.strategies}",
        )

    @property
    def id(self) -> str:
        sharded = "-fsdp" if self.strategies == "fsdp" else ""
        return f"{self.devices}-{self.precisions}-ws{self.world_sizes}{sharded}".replace(",", "+")

    def single(self) -> list[Cells]:
        """Each cell of the filters on its own (without the torch_xla need, which is not a cell's)."""
        return [
            Cells(device, precision, world_size, strategies=self.strategies)
            for device, precision, world_size in itertools.product(
                self.devices.split(","), self.precisions.split(","), self.world_sizes.split(",")
            )
        ]

    def holds(self, row: dict[str, Any]) -> bool:
        """Whether a report row is of one of these cells (a check that takes no cell: of the default cell)."""
        if row["device"] is None:
            return DEFAULT in self.single()
        if row.get("strategy", "none") not in self.strategies.split(","):
            return False
        cell = Cells(row["device"], row["precision"], str(row["world_size"]), strategies=self.strategies)
        return cell in self.single()

    def unavailable(self) -> str | None:
        """Why this machine cannot run these cells, or ``None``."""
        needs = True if "xla" in self.devices.split(",") else self.torch_xla
        if needs is True and not HAS_TORCH_XLA:
            return "torch_xla is not installed"
        if needs is False and HAS_TORCH_XLA:
            return "torch_xla is installed, so its absence cannot be checked"
        return None


DEFAULT = Cells()
F16 = Cells(precisions="16-mixed")
BF16_MIXED = Cells(precisions="bf16-mixed")
BF16_TRUE = Cells(precisions="bf16-true")
F16_TRUE = Cells(precisions="16-true")
F64 = Cells(precisions="64-true")
MIXED = Cells(precisions="bf16-mixed,16-mixed")
DDP = Cells(world_sizes="2")
FSDP = Cells(world_sizes="2", strategies="fsdp")
FSDP_F16 = Cells(precisions="16-mixed", world_sizes="2", strategies="fsdp")
XLA = Cells(devices="xla")
XLA_SPMD = Cells(devices="xla", world_sizes="2")
XLA_F16 = Cells(devices="xla", precisions="16-mixed")
WITHOUT_TORCH_XLA = Cells(torch_xla=False)

ORACLE_PROPERTY = "test_generated_schedules_match_the_oracle"
FAULT_PROPERTY = "test_generated_schedules_with_raising_closures"
RESUME_PROPERTY = "test_generated_schedules_resume_from_checkpoints"
RANK_PROPERTY = "test_generated_schedules_on_ranks_match_the_global_batch"
PROPERTY_CHECKS = (ORACLE_PROPERTY, FAULT_PROPERTY, RESUME_PROPERTY, RANK_PROPERTY)
"""The property checks over generated schedules (a few seconds each per cell)."""

BLIND_BATCHES: Mapping[str, str] = MappingProxyType(
    {
        "contract 2026.12.5": "eight of contract 2026.12.5's mixed-precision mutants (PREC-004, BWD-002, AMP-007, "
        "AMP-008), written blind from the spec text",
        "contract 2026.12.6": "thirteen of contract 2026.12.6's failure-policy mutants, written from the spec text "
        "alone",
        "batch 1": "blind batch 1: 32 mutants written from contract 2026.12.7's text (hooks, closures, AMP and "
        "scheduling, context and errors) by someone who had not read the checks",
        "batch 2": "blind batch 2: six mutants written from the text of DDP-001, FSDP-002, ZERO-002 and XLA-001 "
        "(contract 2026.12.8) by someone who had not read the checks",
        "batch 3": "blind batch 3: 22 mutants written from contract 2026.12.9's text (ZERO-003 to ZERO-007, PREC-001, "
        "PREC-002, ERR-007) by someone who had not read the checks",
        "batch 4": "blind batch 4: 17 mutants written from contract 2026.12.10's text (FAIL-007, CLOS-002, ERR-005, "
        "CTX-002) by someone who had not read the checks",
        "batch 5": "blind batch 5: mutants written from contract 2026.12.11's text (FAIL-008, FAIL-009, WIN-001, "
        "WIN-002) by someone who had not read the checks",
    }
)
"""The blind batches: mutants written from the spec text by someone who had not read the checks, and what each was.

Each batch measured the suite when it came: the mutants it let through became checks (see the README).
"""


@dataclass(frozen=True)
class Mutant:
    """One mutant's declaration: the requirement it breaks and the checks that must catch it, on ``cells``.

    ``blind``: the blind batch (a key of :data:`BLIND_BATCHES`) that wrote it, ``None`` for the project's own.
    ``known_gap``: why the checks named here do not catch it yet, a defect of those checks (reported, to be fixed
    there): its meta-test xfails while they pass against it and fails once they do not; then drop the reason.
    """

    requirement: str
    checks: Sequence[str]
    cells: Cells = DEFAULT
    blind: str | None = None
    known_gap: str | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "checks", tuple(self.checks))
