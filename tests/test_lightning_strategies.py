"""The reference strategies as Lightning objects: ``connect``, constructor arguments, ``trainer.precision``.

A strategy is used the way Lightning's own code and tests use one: connected to a module before any Trainer is
attached to it, built with the arguments of its Lightning strategy, read through ``trainer.precision`` as soon as
the Trainer exists. Real Lightning objects and real fits throughout.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("lightning", reason="the Lightning integration needs lightning, not installed")

from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.strategies import Strategy

from lightning_optimizer.conformance.harness import make_model
from lightning_optimizer.reference.lightning import (
    ReferenceDDPStrategy,
    ReferenceFSDPStrategy,
    ReferencePrecision,
    ReferenceSingleDeviceStrategy,
    ReferenceXLAStrategy,
)
from lightning_optimizer.spec import GradScalerSettings, StepOutcome

TESTS = Path(__file__).resolve().parent
sys.path.insert(0, str(TESTS))

from lightning_scenarios.shared import (  # noqa: E402
    WindowedRegressor,
    reference_trainer,
    regression_loader,
)

needs_xla = pytest.mark.skipif(
    importlib.util.find_spec("torch_xla") is None, reason="unavailable here: torch_xla is not installed"
)


class AutomaticRegressor(LightningModule):
    """Automatic optimization: ``training_step`` returns the loss, Lightning's ``optimizer_step`` steps SGD."""

    def __init__(self) -> None:
        super().__init__()
        self.net = make_model(seed=0)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x).float(), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


# -- connect before a Trainer is attached ------------------------------------------------------------------------


@pytest.mark.parametrize("module", [WindowedRegressor, AutomaticRegressor], ids=["manual", "automatic"])
def test_connect_before_a_trainer_is_attached_then_fit(module: Callable[[], LightningModule], tmp_path: Path) -> None:
    """``trainer.strategy.connect(model)`` on a module no Trainer is attached to, as Lightning's ``Strategy`` allows
    (a checkpoint saved that way, say); the Trainer's own fit then runs as usual, in the module's mode."""
    strategy = ReferenceSingleDeviceStrategy()
    trainer = reference_trainer(
        tmp_path, "32-true", strategy, max_epochs=1, accumulate_grad_batches=3, limit_train_batches=6
    )
    model = module()
    strategy.connect(model)
    assert strategy.lightning_module is model
    assert trainer.accumulate_grad_batches == 3, "connecting without a Trainer changes no Trainer"
    trainer.save_checkpoint(tmp_path / "connected.ckpt")
    assert (tmp_path / "connected.ckpt").is_file()

    trainer.fit(model, train_dataloaders=regression_loader())
    assert trainer.global_step == 2, "two windows of 3 batches: two optimizer steps"
    assert trainer.accumulate_grad_batches == 3
    if isinstance(model, WindowedRegressor):
        assert model.outcomes == [StepOutcome.ACCUMULATED, StepOutcome.ACCUMULATED, StepOutcome.STEPPED] * 2


# -- constructor arguments ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("make", "error", "match"),
    [
        (
            lambda: ReferenceDDPStrategy(scaler=GradScalerSettings()),
            TypeError,
            r"ReferenceDDPStrategy\(\) got an unknown argument 'scaler': did you mean grad_scaler=\.\.\.\?",
        ),
        (
            lambda: ReferenceDDPStrategy(find_unused_parameter=True),
            TypeError,
            r"did you mean find_unused_parameters=\.\.\.\?",
        ),
        (
            lambda: ReferenceDDPStrategy(device_ids=[0]),
            TypeError,
            r"ReferenceDDPStrategy\(device_ids=\.\.\.\): Lightning passes the device ids .* set Trainer\(devices=",
        ),
        (
            lambda: ReferenceFSDPStrategy(scaler=GradScalerSettings()),
            TypeError,
            r"ReferenceFSDPStrategy\(\) got an unknown argument 'scaler': did you mean grad_scaler=\.\.\.\?",
        ),
        (
            lambda: ReferenceSingleDeviceStrategy(device="xla"),
            ValueError,
            r"ReferenceSingleDeviceStrategy does not run on XLA devices: use strategy=ReferenceXLAStrategy\(\)",
        ),
        (
            lambda: ReferenceSingleDeviceStrategy(device="mps"),
            ValueError,
            r"run on CPU, CUDA and XLA, not 'mps'",
        ),
        (
            lambda: ReferenceDDPStrategy(grad_scaler={"init_scale": 4.0}),  # type: ignore[arg-type]
            TypeError,
            "GradScalerSettings",
        ),
    ],
    ids=["ddp-scaler", "ddp-misspelt", "ddp-device-ids", "fsdp-scaler", "single-xla", "single-mps", "ddp-dict"],
)
def test_strategy_arguments_are_refused_in_the_constructor(
    make: Callable[[], Strategy], error: type[Exception], match: str
) -> None:
    """An argument the strategy cannot run is refused when the strategy is built, saying what to pass instead."""
    with pytest.raises(error, match=match):
        make()


def test_the_arguments_of_lightning_and_ddp_are_still_accepted() -> None:
    strategy: Any = ReferenceDDPStrategy(
        find_unused_parameters=True, static_graph=False, start_method="spawn", process_group_backend="gloo"
    )
    assert strategy._ddp_kwargs == {"find_unused_parameters": True, "static_graph": False}
    assert strategy._start_method == "spawn"
    ReferenceFSDPStrategy(save_distributed_checkpoint=False, process_group_backend="gloo")
    ReferenceSingleDeviceStrategy(device=torch.device("cpu"), grad_scaler=GradScalerSettings(init_scale=8.0))


# -- trainer.precision from construction ------------------------------------------------------------------------

PRECISION_CASES: dict[str, tuple[Callable[[], Strategy], str, dict[str, Any]]] = {
    "single-16-mixed": (ReferenceSingleDeviceStrategy, "16-mixed", {}),
    "single-64-true": (ReferenceSingleDeviceStrategy, "64-true", {}),
    "single-bf16-true": (ReferenceSingleDeviceStrategy, "bf16-true", {}),
    "ddp-16-mixed": (ReferenceDDPStrategy, "16-mixed", {"devices": 2}),
    "fsdp-bf16-mixed": (ReferenceFSDPStrategy, "bf16-mixed", {"devices": 2}),
}


@pytest.mark.parametrize(("make", "precision", "options"), PRECISION_CASES.values(), ids=PRECISION_CASES)
def test_trainer_precision_reads_the_requested_precision_from_construction(
    make: Callable[[], Strategy], precision: str, options: dict[str, Any]
) -> None:
    """``trainer.precision`` right after ``Trainer(...)``, before any fit: the precision the reference will run."""
    trainer = Trainer(
        strategy=make(),
        accelerator="cpu",
        precision=precision,  # type: ignore[arg-type]  # one of the reference's names
        logger=False,
        enable_checkpointing=False,
        **options,
    )
    assert isinstance(trainer.precision_plugin, ReferencePrecision)
    assert trainer.precision == precision


@pytest.mark.xla_device
@needs_xla
def test_trainer_precision_on_xla_reads_the_requested_precision_from_construction() -> None:
    trainer = Trainer(strategy=ReferenceXLAStrategy(), devices=1, precision="16-mixed", logger=False)
    assert trainer.precision == "16-mixed"


def test_trainer_precision_is_the_same_before_during_and_after_the_fit(tmp_path: Path) -> None:
    seen: list[str] = []

    class Reads(Callback):
        def on_train_batch_start(self, trainer: Trainer, *args: Any) -> None:
            seen.append(trainer.precision)

    trainer = reference_trainer(tmp_path, "16-mixed", max_epochs=1, limit_train_batches=2, callbacks=[Reads()])
    assert trainer.precision == "16-mixed"
    model = WindowedRegressor()
    trainer.fit(model, train_dataloaders=regression_loader())
    assert seen == ["16-mixed", "16-mixed"]
    assert trainer.precision == "16-mixed"
    assert len(model.outcomes) == 2
