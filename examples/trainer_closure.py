"""The proposal's closure example in a real ``Trainer.fit``: MC dropout, two backward passes per closure.

``opt.step(closure=closure)`` leaves ``make_optimizer_step`` out, so the step follows
``Trainer(accumulate_grad_batches=4)``, which Lightning alone refuses for manual optimization: a real step every
fourth batch and on the epoch's last batch, on the mean gradient of its window. ``self.manual_backward`` works
too: the reference's loss scaler applies to it in 16-mixed. Prints one summary line.
"""

from __future__ import annotations

import logging
import tempfile
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy


class MCDropoutRegressor(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        opt = self.optimizers()

        def compute_loss() -> torch.Tensor:
            predictions = self.net(torch.nn.functional.dropout(x, 0.1))
            predictions = torch.nn.functional.dropout(predictions, 0.1)
            return torch.nn.functional.mse_loss(predictions.float(), y)

        def closure() -> torch.Tensor:
            # emulate MC dropout training
            num_backward = 1
            losses = []
            for backward_idx in range(num_backward + 1):
                loss = compute_loss()
                losses.append(loss)
                retain_graph = num_backward != backward_idx
                self.manual_backward(loss, retain_graph=retain_graph)
            loss_mean = torch.stack(losses).mean()
            loss_std = torch.stack(losses).std()
            self.log("train_loss_mean", loss_mean, on_step=True, prog_bar=True, on_epoch=True)
            self.log("train_loss_std", loss_std, on_step=True, prog_bar=True, on_epoch=True)
            return loss_mean

        # no make_optimizer_step: the step follows Trainer(accumulate_grad_batches=...)
        opt.step(closure=closure)  # type: ignore[union-attr]  # typed: wrapped_optimizers(self, SGD)

    def configure_optimizers(self) -> torch.optim.SGD:
        return torch.optim.SGD(self.net.parameters(), lr=0.05, momentum=0.9)


def main() -> str:
    torch.manual_seed(0)
    x = torch.randn(320, 16)
    y = x[:, :1] - 0.5 * x[:, 1:2]
    model = MCDropoutRegressor()
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(
            strategy=ReferenceSingleDeviceStrategy(),
            accelerator="cpu",
            precision="16-mixed",
            accumulate_grad_batches=4,
            max_epochs=3,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(model, train_dataloaders=DataLoader(TensorDataset(x, y), batch_size=32))
    metrics = trainer.callback_metrics
    return (
        f"Lightning closure, precision {trainer.precision}, accumulate_grad_batches "
        f"{trainer.accumulate_grad_batches}: 9 windows (4, 4, 2 an epoch), global step {trainer.global_step} "
        f"(one a window, as Lightning counts step() calls), loss {float(metrics['train_loss_mean_epoch']):.3f} "
        f"+- {float(metrics['train_loss_std_epoch']):.3f}"
    )


if __name__ == "__main__":
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    print(main())
