"""How an implementation presents itself to the conformance suite.

A module that the suite can test (``--impl=module``) defines a function ``conformance_info()`` that returns an
:class:`ImplementationInfo`. The suite owns the models, data, seeds and oracles; the implementation owns only
the construction of training contexts and the claims of what it supports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypeVar

from lightning_optimizer.spec.context import TrainingContext
from lightning_optimizer.spec.types import DeviceKind, Feature, Precision

__all__ = ["Cell", "ContextFactory", "ImplementationInfo"]

ContextT_co = TypeVar("ContextT_co", bound=TrainingContext, covariant=True)


@dataclass(frozen=True)
class Cell:
    """One column of the conformance matrix: where and how a check runs."""

    device: DeviceKind
    precision: Precision
    world_size: int = 1

    @property
    def id(self) -> str:
        """Short stable id, e.g. ``cpu-32-true-ws1``."""
        return f"{self.device}-{self.precision}-ws{self.world_size}"


class ContextFactory(Protocol[ContextT_co]):
    """Builds a training context for one cell of the matrix.

    The suite calls it in each process of the cell (after it has set up the process group when
    ``cell.world_size > 1``), with the accumulation schedule that the check needs.
    """

    def __call__(
        self,
        cell: Cell,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
    ) -> ContextT_co:
        """A new training context for ``cell`` with this accumulation schedule and clipping."""
        ...


@dataclass(frozen=True)
class ImplementationInfo(Generic[ContextT_co]):
    """An implementation's name, claims and context factory.

    ``expected_failures`` maps a check id (``test_name`` or ``test_name[cell-id]``) to the reason the
    implementation knowingly deviates there; such cells report ``deviation``, and one that passes fails the run.
    In brackets, ``*`` matches any characters (``test_name[cuda-*]``), and other parameters of the check may be
    named instead of the cell (``test_name[pickle]``). The suite's ``--expected-failures-file`` adds entries.
    """

    name: str
    version: str
    contract_version: str
    factory: ContextFactory[ContextT_co]
    devices: frozenset[DeviceKind] = frozenset({"cpu"})
    precisions: frozenset[Precision] = frozenset({"32-true"})
    world_sizes: frozenset[int] = frozenset({1})
    features: frozenset[Feature] = frozenset()
    expected_failures: Mapping[str, str] = field(default_factory=dict)
