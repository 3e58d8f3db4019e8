"""Modules, data and the Trainer that the Lightning tests and their subprocess scenarios share."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_optimizer.conformance.harness import Tolerance, make_batches, make_model
from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy, wrapped_optimizers
from lightning_optimizer.spec import Precision, StepOutcome

Batch = tuple[torch.Tensor, torch.Tensor]

GAN_MODULE = Path(__file__).resolve().parents[1] / "typing" / "pass" / "lightning_gan.py"
BATCHES_PER_EPOCH = 10
EPOCHS = 2


def gan_class() -> type[LightningModule]:
    """The typed GAN module of tests/typing/pass (the file mypy checks is the module these tests train)."""
    spec = importlib.util.spec_from_file_location("typing_pass_lightning_gan", GAN_MODULE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    gan: type[LightningModule] = module.LightningGAN
    return gan


def gan_batches(seed: int = 11) -> list[Batch]:
    """Ten seeded ``(noise, real)`` batches of five samples."""
    generator = torch.Generator().manual_seed(seed)
    return [
        (torch.randn(5, 3, generator=generator), torch.randn(5, 4, generator=generator) + 1.0)
        for _ in range(BATCHES_PER_EPOCH)
    ]


GAN_BATCH = 4
"""Samples per rank and batch of the GAN under DDP (a global batch is two ranks' shards)."""


def gan_data() -> TensorDataset:
    """Noise and real samples for 10 global batches of 8 (4 a rank), for the GAN under DDP."""
    generator = torch.Generator().manual_seed(11)
    samples = 2 * GAN_BATCH * BATCHES_PER_EPOCH
    return TensorDataset(torch.randn(samples, 3, generator=generator), torch.randn(samples, 4, generator=generator) + 1)


class ResumableBatches:
    """A fixed list of batches whose position Lightning checkpoints and restores (a stateful data source).

    Lightning restarts a plain ``DataLoader`` from its first batch when it resumes mid-epoch; an iterable with
    ``state_dict``/``load_state_dict`` resumes where the checkpoint was taken.
    """

    def __init__(self, batches: list[Batch]) -> None:
        self._batches = batches
        self._position = 0

    def __len__(self) -> int:
        return len(self._batches)

    def __iter__(self) -> Iterator[Batch]:
        if self._position >= len(self._batches):
            self._position = 0
        while self._position < len(self._batches):
            batch = self._batches[self._position]
            self._position += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        return {"position": self._position}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._position = int(state_dict["position"])


def regression_data(batch_size: int = 4, batches: int = BATCHES_PER_EPOCH) -> TensorDataset:
    """The harness's seeded regression batches as one dataset (``batches * batch_size`` samples, in order)."""
    pairs = make_batches(batches, batch_size=batch_size)
    return TensorDataset(torch.cat([x for x, _ in pairs]), torch.cat([y for _, y in pairs]))


def regression_loader(batch_size: int = 4, batches: int = BATCHES_PER_EPOCH) -> DataLoader[tuple[torch.Tensor, ...]]:
    return DataLoader(regression_data(batch_size, batches), batch_size=batch_size)


class WindowedRegressor(LightningModule):
    """One SGD optimizer stepped with ``make_optimizer_step`` left out: ``Trainer(accumulate_grad_batches)`` rules.

    The LR scheduler steps after each applied optimizer step, as a manual-optimization user schedules it. With
    ``manual_backward`` the closure backpropagates through Lightning's ``self.manual_backward`` instead of the
    wrapper's ``backward``.
    """

    def __init__(self, manual_backward: bool = False) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = make_model(seed=0)
        self.outcomes: list[StepOutcome | None] = []
        self.use_manual_backward = manual_backward

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        opt = wrapped_optimizers(self, torch.optim.SGD)
        x, y = batch

        def closure() -> torch.Tensor:
            loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
            self.log("loss", loss)
            if self.use_manual_backward:
                self.manual_backward(loss)
            else:
                opt.backward(loss)
            return loss

        loss = opt.step(closure)
        self.outcomes.append(opt.last_outcome)
        if opt.last_outcome is StepOutcome.STEPPED:
            scheduler = self.lr_schedulers()
            assert isinstance(scheduler, torch.optim.lr_scheduler.LRScheduler)
            scheduler.step()
        return loss.detach()

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        return [optimizer], [torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)]


class BackwardThenStep(LightningModule):
    """The proposal's first example: two optimizers, each ``opt.backward(loss)`` then ``opt.step()``.

    The second loss is backpropagated twice (``retain_graph=True`` first), so its head's gradient is doubled.
    ``make_optimizer_step`` is left out: the Trainer's ``accumulate_grad_batches`` decides the windows.
    """

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.head_a = make_model(seed=0)
        self.head_b = make_model(seed=1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt_a, opt_b = wrapped_optimizers(self, torch.optim.SGD, torch.optim.Adam)
        x, y = batch
        loss_a = torch.nn.functional.mse_loss(self.head_a(x).float(), y)
        opt_a.backward(loss_a)
        opt_a.step()
        loss_b = torch.nn.functional.mse_loss(self.head_b(x).float(), y)
        opt_b.backward(loss_b, retain_graph=True)
        opt_b.backward(loss_b)
        opt_b.step()

    def configure_optimizers(self) -> Any:
        return [
            torch.optim.SGD(self.head_a.parameters(), lr=0.1, momentum=0.9),
            torch.optim.Adam(self.head_b.parameters(), lr=0.01),
        ]


class AutomaticWindowedRegressor(LightningModule):
    """``WindowedRegressor`` under automatic optimization: the same net, SGD and StepLR (``interval="step"``).

    Lightning steps the scheduler after each optimizer step it counts, so a plain loop of ``WindowedRegressor``
    is this module's oracle too. ``optimizer_step`` is the proposal's override, recording each outcome.
    """

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model(seed=0)
        self.outcomes: list[StepOutcome | None] = []

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss: torch.Tensor = torch.nn.functional.mse_loss(self.net(x).float(), y)
        return loss

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)
        self.outcomes.append(optimizer.last_outcome)

    def configure_optimizers(self) -> Any:
        optimizer = torch.optim.SGD(self.net.parameters(), lr=0.1, momentum=0.9)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}


def reference_trainer(root: Path, precision: str, strategy: Any = None, **kwargs: Any) -> Trainer:
    """A quiet CPU Trainer on ``strategy`` (the reference's single-device one), writing only under ``root``."""
    options: dict[str, Any] = {
        "max_epochs": EPOCHS,
        "devices": 1,
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
    }
    options.update(kwargs)
    return Trainer(
        strategy=ReferenceSingleDeviceStrategy() if strategy is None else strategy,
        accelerator="cpu",
        precision=precision,  # type: ignore[arg-type]  # one of the reference's names, checked by the strategy
        default_root_dir=root,
        **options,
    )


RESUME_PRECISION = "16-mixed"
"""The resume scenario's precision: the loss scaler's state must survive the checkpoint too."""
RESUME_SAVE_AT = 5
"""The batch of epoch 0 after which the interrupted run saves: the generator's window {5, 6} is open there."""


def run_gan(
    root: Path, batches: ResumableBatches, *, ckpt_path: Path | None = None, callbacks: list[Any] | None = None
) -> tuple[LightningModule, Trainer]:
    """The resume scenario's run: the typed GAN in 16-mixed, on resumable data."""
    model = gan_class()()
    trainer = reference_trainer(root, RESUME_PRECISION, callbacks=callbacks or [])
    trainer.fit(model, train_dataloaders=batches, ckpt_path=ckpt_path)
    return model, trainer


def oracle_autocast(precision: Precision) -> AbstractContextManager[Any]:
    dtype = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(precision)
    return nullcontext() if dtype is None else torch.autocast(device_type="cpu", dtype=dtype, cache_enabled=False)


def assert_params_close(actual: torch.nn.Module, expected: torch.nn.Module, tolerance: Tolerance, what: str) -> None:
    for (name, got), (_, want) in zip(actual.named_parameters(), expected.named_parameters(), strict=True):
        got_cpu, want_cpu = got.detach().double(), want.detach().double()
        diff = (got_cpu - want_cpu).abs().max().item()
        assert torch.allclose(got_cpu, want_cpu, rtol=tolerance.rtol, atol=tolerance.atol), (
            f"{what}: {name} differs from the plain loop by {diff:.3g} (rtol {tolerance.rtol}, atol {tolerance.atol})"
        )
