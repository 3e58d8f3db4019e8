"""Automatic optimization with an ``optimizer_step`` override, the proposal's motivating case, in a real Trainer.

An existing automatic-optimization project changes one argument: ``Trainer(strategy=ReferenceSingleDeviceStrategy())``
(or ``strategy="reference"``, registered when ``lightning_optimizer.reference.lightning`` is imported; by name,
Lightning has chosen the precision before the strategy exists, and on the CPU it turns 16-mixed into
bf16-mixed). The override below is Lightning's documented learning-rate warm-up; the ``optimizer`` it receives
is the reference's wrapper, so ``optimizer.step(closure=optimizer_closure)`` applies float16 loss scaling (real
fp16 on the CPU), the Trainer's ``accumulate_grad_batches`` and ``gradient_clip_val``, and counts only the steps
it takes. Prints one summary line.
"""

from __future__ import annotations

import logging
import tempfile
import warnings
from typing import Any

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy
from lightning_optimizer.spec import StepOutcome

LEARNING_RATE, WARMUP_STEPS = 0.05, 5


class WarmupRegressor(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))
        self.outcomes: list[StepOutcome | None] = []

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x).float(), y)
        self.log("train_loss", loss, on_step=False, on_epoch=True)
        return loss

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        # warm up the learning rate over the first windows (Lightning calls optimizer_step once per window)
        scale = min(1.0, float(self.trainer.global_step + 1) / WARMUP_STEPS)
        for group in optimizer.param_groups:
            group["lr"] = scale * LEARNING_RATE
        assert isinstance(optimizer, WrappedOptimizer)
        optimizer.step(closure=optimizer_closure)
        self.outcomes.append(optimizer.last_outcome)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.net.parameters(), lr=LEARNING_RATE, momentum=0.9)


def main() -> str:
    torch.manual_seed(0)
    x = torch.randn(320, 16)
    y = x[:, :1] - 0.5 * x[:, 1:2]
    model = WarmupRegressor()
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(
            strategy=ReferenceSingleDeviceStrategy(),
            accelerator="cpu",
            precision="16-mixed",
            accumulate_grad_batches=4,
            gradient_clip_val=1.0,
            max_epochs=3,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(model, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=32))
    stepped = model.outcomes.count(StepOutcome.STEPPED)
    skipped = model.outcomes.count(StepOutcome.SKIPPED_NON_FINITE)
    assert trainer.global_step == len(model.outcomes), "one global step per window, a skipped one too, as in Lightning"
    return (
        f"Lightning optimizer_step override, precision {trainer.precision}, accumulate_grad_batches "
        f"{trainer.accumulate_grad_batches}: {len(model.outcomes)} calls, {stepped} steps applied, {skipped} skipped "
        f"(float16 overflow), global step {trainer.global_step}, "
        f"loss {float(trainer.callback_metrics['train_loss']):.3f}"
    )


if __name__ == "__main__":
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    print(main())
