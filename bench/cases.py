"""What is timed: the models, their batches, the optimizers, accumulation and the precisions, as named cases.

A case's name is ``<model>[-adam][-acc<k>]-<precision>``: ``small-32-true`` is the small model with SGD, one
micro-step per optimizer step; ``large-adam-acc4-32-true`` the 25M-parameter MLP with Adam and windows of 4
micro-steps. The unit of time is the *step*: one optimizer step, i.e. one window of ``accumulate`` micro-steps
(forward and backward each) and the step that closes it. Without accumulation a step is one plain iteration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:  # torch is imported where models are built: the parent process only orchestrates
    import torch

Precision = Literal["32-true", "16-mixed"]
OptimizerName = Literal["sgd", "adam"]
PRECISIONS: tuple[Precision, ...] = ("32-true", "16-mixed")
LEARNING_RATE = 1e-3
IMPLEMENTATIONS = (
    "raw",
    "reference",
    "reference-direct",
    "reference-restore",
    "reference-direct-restore",
    "reference-user-zero",
    "reference-carry",
    "lightning",
    "fabric",
    "accelerate",
)
"""The timed loops of :mod:`bench.loops`; ``raw`` first: every ratio is taken against it. The ``-restore`` loops
are the reference with ``on_failure="restore"`` (FAIL-004), whose price is paid only under accumulation. The
``reference-user-zero`` and ``reference-carry`` loops are the reference with ``zero_grad_after_step=False``
(ZERO-003): the closure calls ``zero_grad()`` at each window's first micro-step (Lightning's automatic loop), or at
every other window's, so that the windows between carry the last step's gradients (ZERO-005)."""
RESTORE_IMPLEMENTATIONS = ("reference-restore", "reference-direct-restore")


def implementations_for(case: Case, impls: tuple[str, ...]) -> tuple[str, ...]:
    """``impls`` on ``case``: the ``-restore`` loops only where a window spans several micro-steps."""
    return tuple(impl for impl in impls if case.accumulate > 1 or impl not in RESTORE_IMPLEMENTATIONS)


@dataclass(frozen=True)
class ModelSpec:
    """An MLP of ``layers`` square ``Linear(width, width)`` (ReLU between them) and its batch."""

    name: str
    description: str
    width: int
    layers: int
    batch: int

    @property
    def parameters(self) -> int:
        """Weights and biases."""
        return self.layers * (self.width * self.width + self.width)

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


SMALL = ModelSpec("small", "Linear(32, 32), batch 8", width=32, layers=1, batch=8)
MID = ModelSpec("mid", "MLP of 4 Linear(1024, 1024) (4.2M parameters), batch 16", width=1024, layers=4, batch=16)
LARGE = ModelSpec("large", "MLP of 6 Linear(2048, 2048) (25.2M parameters), batch 16", width=2048, layers=6, batch=16)
MODELS = {spec.name: spec for spec in (SMALL, MID, LARGE)}


@dataclass(frozen=True)
class Case:
    """One timed case: a model, an optimizer, micro-steps per optimizer step, a precision, and how long to run."""

    model: ModelSpec
    precision: Precision
    optimizer: OptimizerName
    accumulate: int
    """Micro-steps per optimizer step (``accumulate_grad_batches``)."""
    windows: int
    """Timed optimizer steps per run (each of ``accumulate`` micro-steps)."""
    warmup: int
    """Untimed optimizer steps first."""

    @property
    def name(self) -> str:
        """``<model>[-adam][-acc<k>]-<precision>``, e.g. ``small-16-mixed``, ``large-adam-acc4-32-true``."""
        optimizer = "" if self.optimizer == "sgd" else f"-{self.optimizer}"
        accumulate = "" if self.accumulate == 1 else f"-acc{self.accumulate}"
        return f"{self.model.name}{optimizer}{accumulate}-{self.precision}"

    @property
    def description(self) -> str:
        """The model, the optimizer, the accumulation and the precision, in words."""
        optimizer = {"sgd": "SGD", "adam": "Adam"}[self.optimizer]
        window = f", steps of {self.accumulate} micro-steps" if self.accumulate > 1 else ""
        return f"{self.model.description}, {optimizer}{window}, {self.precision}"

    def build_optimizer(self, params: object) -> torch.optim.Optimizer:
        """The case's optimizer on ``params`` (an iterable of parameters)."""
        import torch

        if self.optimizer == "adam":
            return torch.optim.Adam(params, lr=LEARNING_RATE)  # type: ignore[arg-type]
        return torch.optim.SGD(params, lr=LEARNING_RATE)  # type: ignore[arg-type]


def _case(model: ModelSpec, precision: Precision, optimizer: OptimizerName = "sgd", accumulate: int = 1) -> Case:
    """A case with timed and warm-up steps sized so that one run takes about a second (fp16 on CPU is slow)."""
    timed, warmup = {
        # model: (timed micro-steps per run, untimed micro-steps first), in 32-true and in 16-mixed
        "small": ((400, 40), (400, 40)),
        "mid": ((60, 4), (6, 1)),
        "large": ((60, 4), (12, 4)),  # the target: 60 micro-steps, 15 steps of 4
    }[model.name][PRECISIONS.index(precision)]
    return Case(model, precision, optimizer, accumulate, max(1, timed // accumulate), max(1, warmup // accumulate))


TIMED_CASES = {
    case.name: case
    for case in (
        *(
            _case(model, p, opt, acc)
            for model in (SMALL, MID)
            for opt in ("sgd", "adam")
            for acc in (1, 4)
            for p in PRECISIONS
        ),
        *(_case(LARGE, p, "adam", 4) for p in PRECISIONS),
    )
}
TARGET_CASE = "large-adam-acc4-32-true"
"""The case the wrapper's overhead is judged on: whole process, one thread, Adam, 25M parameters, 4 micro-steps."""
DDP_CASE = "ddp"
"""The DDP accumulation case (two gloo ranks), run by :mod:`bench.ddp`."""
FSDP_CASE = "fsdp"
"""The FSDP2 accumulation case (two gloo ranks), run by :mod:`bench.fsdp`."""
RANK_CASES = (DDP_CASE, FSDP_CASE)
ALL_CASES = (*TIMED_CASES, *RANK_CASES)
DEFAULT_CASES = (
    "small-32-true",
    "small-16-mixed",
    "small-adam-acc4-32-true",
    "small-adam-acc4-16-mixed",
    TARGET_CASE,
)
"""What ``python -m bench`` times without ``--cases`` (about 20 minutes on 2 cores): the per-call cost on a small
model, with and without accumulation, and the target case; ``--cases default,ddp,fsdp`` adds the DDP and FSDP
cases, ``--cases all`` runs every case (the mid-size ones too)."""


def mse(output: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The loss every implementation minimises."""
    import torch

    return torch.nn.functional.mse_loss(output, target)
