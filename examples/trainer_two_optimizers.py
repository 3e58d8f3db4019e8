"""The proposal's first example in a real ``Trainer.fit``: two optimizers, each ``backward`` then ``step``.

Two lines differ from a plain manual-optimization module: the import of ``ReferenceSingleDeviceStrategy`` and
``Trainer(strategy=ReferenceSingleDeviceStrategy(), ...)``. In bf16-mixed the forward passes autocast to
bfloat16 (the reference's autocast, applied once). Prints one summary line.
"""

from __future__ import annotations

import logging
import tempfile
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy


class TwoHeads(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.head_a = torch.nn.Linear(16, 1)
        self.head_b = torch.nn.Linear(16, 1)

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        (opt_a, opt_b) = self.optimizers()  # type: ignore[attr-defined]  # typed: wrapped_optimizers(self, ...)

        loss_a = torch.nn.functional.mse_loss(self.head_a(x).float(), y)
        # the wrapper's backward applies the precision (it scales the loss in 16-mixed)
        opt_a.backward(loss_a)
        opt_a.step()

        loss_b = torch.nn.functional.mse_loss(self.head_b(x).float(), y)
        # pass in any args that loss.backward() normally takes
        opt_b.backward(loss_b, retain_graph=True)
        opt_b.backward(loss_b)
        opt_b.step()

        self.log("loss_a", loss_a, on_epoch=True)
        self.log("loss_b", loss_b, on_epoch=True)

    def configure_optimizers(self) -> tuple[torch.optim.SGD, torch.optim.Adam]:
        return torch.optim.SGD(self.head_a.parameters(), lr=0.05), torch.optim.Adam(self.head_b.parameters(), lr=0.01)


def main() -> str:
    torch.manual_seed(0)
    x = torch.randn(320, 16)
    y = x[:, :1] * 2.0 - 1.0
    model = TwoHeads()
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(
            strategy=ReferenceSingleDeviceStrategy(),
            accelerator="cpu",
            precision="bf16-mixed",
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
        f"Lightning two optimizers, precision {trainer.precision}: global step {trainer.global_step} "
        f"(2 optimizers x 10 batches x 3 epochs), loss_a {float(metrics['loss_a_epoch']):.3f}, "
        f"loss_b {float(metrics['loss_b_epoch']):.3f}"
    )


if __name__ == "__main__":
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    print(main())
