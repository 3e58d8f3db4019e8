"""How an implementation presents itself to the conformance suite.

A module that the suite can test (``--impl=module``) defines a function ``conformance_info()`` that returns an
:class:`ImplementationInfo`. The suite owns the models, data, seeds and oracles; the implementation owns only
the construction of training contexts and the claims of what it supports.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Generic, Literal, Protocol, TypedDict, TypeVar

from lightning_optimizer.spec.context import TrainingContext
from lightning_optimizer.spec.types import CONTRACT_VERSION, DeviceKind, FailurePolicy, Feature, Precision, Strategy

__all__ = [
    "Cell",
    "ContextFactory",
    "GradScalerKwargs",
    "GradScalerSettings",
    "ImplementationInfo",
    "check_factory",
    "implementation_info",
]

ContextT_co = TypeVar("ContextT_co", bound=TrainingContext, covariant=True)
ContextT = TypeVar("ContextT", bound=TrainingContext)


@dataclass(frozen=True)
class Cell:
    """One column of the conformance matrix: where and how a check runs.

    ``strategy`` says how the ``world_size`` ranks share the model. ``"none"`` (the default) is one process at
    world size 1 and stands, above it, for ``"ddp"`` on CPU and CUDA (one process per rank, a process group) and
    for ``"spmd"`` on XLA (one process driving ``world_size`` devices, no process group, XLA-002): so
    ``Cell("cpu", "32-true", 2).strategy == "ddp"`` and ``Cell("xla", "32-true", 2).strategy == "spmd"``.
    ``"fsdp"`` needs several ranks; ``"spmd"`` is XLA's and needs several devices. Each strategy is claimed on its
    own (:attr:`ImplementationInfo.strategies`), so DDP on CPU and XLA on one device are claimed without XLA SPMD.
    """

    device: DeviceKind
    precision: Precision
    world_size: int = 1
    strategy: Strategy = "none"

    def __post_init__(self) -> None:
        if self.world_size > 1 and self.strategy == "none":
            object.__setattr__(self, "strategy", "spmd" if self.device == "xla" else "ddp")
        elif self.world_size == 1 and self.strategy != "none":
            raise ValueError(f"strategy {self.strategy!r} needs several ranks; a cell of world size 1 has 'none'")
        elif self.strategy == "spmd" and self.device != "xla":
            raise ValueError(
                f"strategy 'spmd' is XLA's; a {self.device} cell of world size {self.world_size} has 'ddp' or 'fsdp'"
            )

    @property
    def id(self) -> str:
        """Short stable id, e.g. ``cpu-32-true-ws1``; a sharded cell ends in its strategy (``cpu-32-true-ws2-fsdp``).

        An XLA cell above world size 1 is SPMD and a CPU or CUDA one DDP unless the id ends in ``-fsdp``.
        """
        suffix = "-fsdp" if self.strategy == "fsdp" else ""
        return f"{self.device}-{self.precision}-ws{self.world_size}{suffix}"


class GradScalerKwargs(TypedDict):
    """The keyword arguments of ``torch.amp.GradScaler`` that :class:`GradScalerSettings` sets."""

    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int


@dataclass(frozen=True)
class GradScalerSettings:
    """The loss scaler a 16-mixed check asks for: the arguments of ``torch.amp.GradScaler``, torch's defaults.

    The suite passes settings to the factory (``grad_scaler=``) in every 16-mixed cell: torch's defaults, or others
    where a check needs the scale to start elsewhere or to grow within a few iterations (``growth_interval=1``);
    the context's ``GradScaler`` is built with exactly these arguments, and the check's plain-PyTorch oracle builds
    its own ``GradScaler`` with the same ones.
    """

    init_scale: float = 2.0**16
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000

    def __post_init__(self) -> None:
        problems = []
        if not _finite_number(self.init_scale) or self.init_scale <= 0:
            problems.append(f"init_scale must be a positive number, got {self.init_scale!r}")
        if not _finite_number(self.growth_factor) or self.growth_factor <= 1:
            problems.append(f"growth_factor must be a number above 1, got {self.growth_factor!r}")
        if not _finite_number(self.backoff_factor) or not 0 < self.backoff_factor < 1:
            problems.append(f"backoff_factor must be a number between 0 and 1, got {self.backoff_factor!r}")
        interval: object = self.growth_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
            problems.append(f"growth_interval must be a positive int, got {interval!r}")
        if problems:
            raise ValueError("; ".join(problems))

    def as_kwargs(self) -> GradScalerKwargs:
        """The settings as keyword arguments of ``torch.amp.GradScaler(device, **kwargs)``."""
        return GradScalerKwargs(
            init_scale=self.init_scale,
            growth_factor=self.growth_factor,
            backoff_factor=self.backoff_factor,
            growth_interval=self.growth_interval,
        )


def _finite_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class ContextFactory(Protocol[ContextT_co]):
    """Builds a training context for one cell of the matrix.

    The suite calls it in each process of the cell (after it has set up the process group when
    ``cell.world_size > 1``), with the accumulation schedule, the clipping and, in 16-mixed cells, the loss
    scaler settings that the check needs. In a 16-mixed cell the suite always passes ``grad_scaler`` (torch's
    ``GradScaler`` defaults where a check needs no other), and the context must build its ``GradScaler`` with
    exactly those settings: no check depends on an implementation's own default configuration. The settings the
    suite passes scale by powers of two, so rescaling an open window (AMP-006) is exact. In other cells it passes
    none (``grad_scaler=None``). In a cell of strategy ``"fsdp"`` the context shards what it prepares (FSDP-001).
    The suite passes ``on_failure="restore"`` only to an implementation that claims the feature ``"exact_restore"``,
    and leaves the default (``"discard"``, FAIL-001) otherwise; likewise ``zero_grad_after_step=False`` only to one
    that claims ``"user_zero_grad"`` (ZERO-003), leaving the default ``True`` otherwise.
    """

    def __call__(
        self,
        cell: Cell,
        *,
        accumulate_grad_batches: int = 1,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: Literal["norm", "value"] = "norm",
        grad_scaler: GradScalerSettings | None = None,
        on_failure: FailurePolicy = "discard",
        zero_grad_after_step: bool = True,
    ) -> ContextT_co:
        """A new training context for ``cell`` with this accumulation schedule, clipping, loss scaler and policies."""
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
    strategies: frozenset[Strategy] = frozenset({"none", "ddp"})
    features: frozenset[Feature] = frozenset()
    expected_failures: Mapping[str, str] = field(default_factory=dict)


FACTORY_CALL = (
    "factory(cell, *, accumulate_grad_batches=1, gradient_clip_val=None, gradient_clip_algorithm='norm', "
    "grad_scaler=None, on_failure='discard', zero_grad_after_step=True)"
)
"""How the suite calls a context factory (see :class:`ContextFactory`)."""


def check_factory(factory: object) -> None:
    """Raise ``TypeError`` unless ``factory`` can be called as the suite calls it (:data:`FACTORY_CALL`).

    The check binds the call to the factory's signature (a class: its constructor's); a callable whose signature
    Python cannot read is accepted as it is.
    """
    if not callable(factory):
        raise TypeError(f"a context factory must be callable, got {type(factory).__name__}")
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return
    try:
        signature.bind(
            Cell("cpu", "32-true"),
            accumulate_grad_batches=1,
            gradient_clip_val=None,
            gradient_clip_algorithm="norm",
            grad_scaler=None,
            on_failure="discard",
            zero_grad_after_step=True,
        )
    except TypeError as error:
        name = getattr(factory, "__qualname__", type(factory).__name__)
        raise TypeError(
            f"the context factory {name}{signature} cannot be called as the suite calls it, {FACTORY_CALL}: "
            f"{error}. Give it the signature of lightning_optimizer.spec.ContextFactory"
        ) from None


def implementation_info(
    factory: ContextFactory[ContextT],
    *,
    name: str,
    version: str,
    devices: Iterable[DeviceKind] = ("cpu",),
    precisions: Iterable[Precision] = ("32-true",),
    world_sizes: Iterable[int] = (1,),
    strategies: Iterable[Strategy] = ("none", "ddp"),
    features: Iterable[Feature] = (),
    expected_failures: Mapping[str, str] | None = None,
    contract_version: str = CONTRACT_VERSION,
) -> ImplementationInfo[ContextT]:
    """An :class:`ImplementationInfo` for ``factory``: a context class or function taking :data:`FACTORY_CALL`.

    The claims may be any iterables of names (a set, a tuple); ``contract_version`` defaults to the version of
    the installed contract. Raises ``TypeError`` when ``factory`` cannot take the suite's call, or a claim is a
    single string instead of a collection of names.
    """
    check_factory(factory)
    claims = {
        "devices": devices,
        "precisions": precisions,
        "world_sizes": world_sizes,
        "strategies": strategies,
        "features": features,
    }
    for claim, names in claims.items():
        if isinstance(names, str | bytes):
            raise TypeError(f"{claim} must be a collection of names, got the string {names!r}: write {{{names!r}}}")
    return ImplementationInfo(
        name=name,
        version=version,
        contract_version=contract_version,
        factory=factory,
        devices=frozenset(devices),
        precisions=frozenset(precisions),
        world_sizes=frozenset(world_sizes),
        strategies=frozenset(strategies),
        features=frozenset(features),
        expected_failures=dict(expected_failures or {}),
    )
