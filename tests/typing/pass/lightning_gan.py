"""The proposal's GAN as a manual-optimization ``LightningModule``, run by the reference's Lightning strategy.

``wrapped_optimizers(self, Adam, SGD)`` is ``self.optimizers()`` with the types mypy cannot infer from Lightning:
the reference's wrapper around each inner optimizer. tests/test_lightning.py trains this module in a real
``Trainer.fit``.
"""

from __future__ import annotations

import torch
from lightning.pytorch import LightningModule
from typing_extensions import assert_type

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.reference.lightning import wrapped_optimizers
from lightning_optimizer.spec import OptimizerWrapper

LATENT = 3
FEATURES = 4


class LightningGAN(LightningModule):
    """Linear generator and discriminator: the generator accumulates over 2 batches, the discriminator steps every 4."""

    def __init__(self, seed: int = 7) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Linear(LATENT, FEATURES)
        self.discriminator = torch.nn.Linear(FEATURES, 1)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        optimizers = wrapped_optimizers(self, torch.optim.Adam, torch.optim.SGD)
        assert_type(optimizers, tuple[WrappedOptimizer[torch.optim.Adam], WrappedOptimizer[torch.optim.SGD]])
        opt_gen, opt_dis = optimizers
        assert_type(opt_gen, WrappedOptimizer[torch.optim.Adam])
        assert_type(opt_dis, WrappedOptimizer[torch.optim.SGD])
        assert_type(opt_gen.optimizer, torch.optim.Adam)
        as_protocol: OptimizerWrapper[torch.optim.SGD] = opt_dis
        del as_protocol
        noise, real = batch

        def gen_closure() -> torch.Tensor:
            loss_gen: torch.Tensor = -self.discriminator(self.generator(noise)).mean()
            self.log("loss_gen", loss_gen, on_step=True, on_epoch=True, prog_bar=True)
            opt_gen.backward(loss_gen)
            return loss_gen

        def dis_closure() -> torch.Tensor:
            fake = self.generator(noise).detach()
            loss_dis: torch.Tensor = self.discriminator(fake).mean() - self.discriminator(real).mean()
            self.log("loss_dis", loss_dis, on_step=True, on_epoch=True)
            opt_dis.backward(loss_dis)
            return loss_dis

        # accumulate generator gradients over 2 batches, then step
        assert_type(opt_gen.step(closure=gen_closure, make_optimizer_step=batch_idx % 2 == 0), torch.Tensor)
        # discriminator every 4 batches, no accumulation
        if batch_idx % 4 == 0:
            opt_dis.step(closure=dis_closure, make_optimizer_step=True)

    def configure_optimizers(self) -> tuple[torch.optim.Adam, torch.optim.SGD]:
        return (
            torch.optim.Adam(self.generator.parameters(), lr=0.01),
            torch.optim.SGD(self.discriminator.parameters(), lr=0.05),
        )
