"""What is timed: the models, their batches and the precisions, as named cases (``small-32-true``, ...)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where models are built: the parent process only orchestrates
    import torch

Precision = Literal["32-true", "16-mixed"]
PRECISIONS: tuple[Precision, ...] = ("32-true", "16-mixed")
LEARNING_RATE = 1e-3
IMPLEMENTATIONS = ("raw", "reference", "reference-direct", "lightning", "fabric", "accelerate")
"""The timed loops of :mod:`bench.loops`; ``raw`` first: every ratio is taken against it."""


@dataclass(frozen=True)
class ModelSpec:
    """A model, its batch and how long one repeat of it runs by default."""

    name: str
    description: str
    width: int
    layers: int
    batch: int
    iterations: int
    """Timed iterations per implementation per repeat."""
    turn: int
    """Timed iterations an implementation runs back to back before the next one takes its turn."""
    rewarm: int
    """Untimed iterations at the start of each turn (the caches were the previous implementation's)."""
    warmup: int
    """Untimed iterations before an implementation's first repeat."""

    def build(self) -> torch.nn.Module:
        """The model, initialised from a fixed seed so that every implementation starts from the same weights."""
        import torch

        generator_state = torch.random.get_rng_state()
        torch.manual_seed(0)
        try:
            modules: list[torch.nn.Module] = []
            for index in range(self.layers):
                if index:
                    modules.append(torch.nn.ReLU())
                modules.append(torch.nn.Linear(self.width, self.width))
            return modules[0] if len(modules) == 1 else torch.nn.Sequential(*modules)
        finally:
            torch.random.set_rng_state(generator_state)

    def data(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """One fixed batch of inputs and targets on ``device`` (fp32; autocast casts where it applies)."""
        import torch

        generator = torch.Generator().manual_seed(1)
        inputs = torch.randn(self.batch, self.width, generator=generator)
        targets = torch.randn(self.batch, self.width, generator=generator)
        return inputs.to(device), targets.to(device)


SMALL = ModelSpec(
    "small", "Linear(32, 32), batch 8, SGD", width=32, layers=1, batch=8, iterations=100, turn=10, rewarm=1, warmup=30
)
MID = ModelSpec(
    "mid",
    "MLP of 4 Linear(1024, 1024), batch 16, SGD",
    width=1024,
    layers=4,
    batch=16,
    iterations=4,
    turn=1,
    rewarm=0,
    warmup=2,
)
MODELS = {spec.name: spec for spec in (SMALL, MID)}


@dataclass(frozen=True)
class Case:
    """One timed case: a model in a precision."""

    model: ModelSpec
    precision: Precision

    @property
    def name(self) -> str:
        """``<model>-<precision>``, e.g. ``small-16-mixed``."""
        return f"{self.model.name}-{self.precision}"


TIMED_CASES = {case.name: case for case in (Case(model, p) for model in (SMALL, MID) for p in PRECISIONS)}
DDP_CASE = "ddp"
"""The DDP accumulation case (two gloo ranks), run by :mod:`bench.ddp`."""
ALL_CASES = (*TIMED_CASES, DDP_CASE)


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss every implementation minimises."""
    import torch

    return torch.nn.functional.mse_loss(output, target)
