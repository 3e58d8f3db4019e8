"""The proposal's GAN in a real ``Trainer.fit``: two lines differ from a plain manual-optimization module.

1. ``from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy``
2. ``Trainer(strategy=ReferenceSingleDeviceStrategy(), ...)``

``training_step`` is the proposal's. ``precision="16-mixed"`` on the CPU is real float16 with a loss scaler
(Lightning alone would switch to bf16-mixed). Prints one summary line.
"""

from __future__ import annotations

import logging
import tempfile
import warnings

import torch
from lightning.pytorch import LightningModule, Trainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

LATENT, FEATURES = 8, 16


class GAN(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Sequential(
            torch.nn.Linear(LATENT, 32), torch.nn.Tanh(), torch.nn.Linear(32, FEATURES)
        )
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(FEATURES, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    def training_step(self, batch: list[torch.Tensor], batch_idx: int) -> None:
        (real,) = batch
        noise = torch.randn(real.shape[0], LATENT)
        opt_gen, opt_dis = self.optimizers()  # type: ignore[attr-defined]  # typed: wrapped_optimizers(self, ...)

        def gen_closure() -> None:
            loss_gen = -self.discriminator(self.generator(noise)).mean()
            self.log("loss_gen", loss_gen, on_step=True, on_epoch=True)
            opt_gen.backward(loss_gen)

        def dis_closure() -> None:
            loss_dis = self.discriminator(self.generator(noise).detach()).mean() - self.discriminator(real).mean()
            self.log("loss_dis", loss_dis, on_step=True, on_epoch=True)
            opt_dis.backward(loss_dis)

        # accumulate generator gradients over 2 batches, then step
        opt_gen.step(closure=gen_closure, make_optimizer_step=batch_idx % 2 == 0)
        # discriminator every 4 batches, no accumulation
        if batch_idx % 4 == 0:
            opt_dis.step(closure=dis_closure, make_optimizer_step=True)

    def configure_optimizers(self) -> tuple[torch.optim.Adam, torch.optim.SGD]:
        return (
            torch.optim.Adam(self.generator.parameters(), lr=1e-3),
            torch.optim.SGD(self.discriminator.parameters(), lr=1e-2),
        )


def main() -> str:
    torch.manual_seed(0)
    real = torch.randn(640, FEATURES) + 1.0
    model = GAN()
    with tempfile.TemporaryDirectory() as root:
        trainer = Trainer(
            strategy=ReferenceSingleDeviceStrategy(),
            accelerator="cpu",
            precision="16-mixed",
            max_epochs=2,
            logger=False,
            enable_checkpointing=False,
            enable_progress_bar=False,
            enable_model_summary=False,
            default_root_dir=root,
        )
        trainer.fit(model, train_dataloaders=DataLoader(TensorDataset(real), batch_size=64))
    metrics = trainer.callback_metrics
    return (
        f"Lightning GAN, precision {trainer.precision}: {trainer.current_epoch} epochs, global step "
        f"{trainer.global_step} (steps that closed a window), loss_gen {float(metrics['loss_gen_epoch']):.3f}, "
        f"loss_dis {float(metrics['loss_dis_epoch']):.3f}"
    )


if __name__ == "__main__":
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*does not have many workers.*")
    print(main())
