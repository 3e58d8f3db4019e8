"""The proposal's GAN on ``pytorch_lightning``, typed through ``lightning_optimizer.reference.pytorch_lightning``.

The twin is built at import time, so mypy reads its declared surface (``reference/pytorch_lightning.pyi``): the
strategies as subclasses of ``pytorch_lightning``'s, with their constructors, and ``wrapped_optimizers``, the same
structurally typed function as ``lightning_optimizer.reference.lightning``'s. Nothing here needs a cast or an ignore.
"""

from __future__ import annotations

import torch
from pytorch_lightning import LightningModule, Trainer
from typing_extensions import assert_type

from lightning_optimizer.reference import TrainingContext, WrappedOptimizer
from lightning_optimizer.reference.pytorch_lightning import (
    STRATEGY_NAMES,
    ReferenceDDPStrategy,
    ReferenceSingleDeviceStrategy,
    wrapped_optimizers,
)
from lightning_optimizer.spec import GradScalerSettings


class StandaloneGAN(LightningModule):
    """Linear generator and discriminator: the generator accumulates over 2 batches, the discriminator steps every 4."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.generator = torch.nn.Linear(3, 4)
        self.discriminator = torch.nn.Linear(4, 1)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        opt_gen, opt_dis = wrapped_optimizers(self, torch.optim.Adam, torch.optim.SGD)
        assert_type(opt_gen, WrappedOptimizer[torch.optim.Adam])
        assert_type(opt_dis, WrappedOptimizer[torch.optim.SGD])
        noise, real = batch

        def gen_closure() -> None:
            opt_gen.backward(-self.discriminator(self.generator(noise)).mean())

        def dis_closure() -> None:
            fake = self.generator(noise).detach()
            opt_dis.backward(self.discriminator(fake).mean() - self.discriminator(real).mean())

        opt_gen.step(closure=gen_closure, make_optimizer_step=batch_idx % 2 == 0)
        if batch_idx % 4 == 0:
            opt_dis.step(closure=dis_closure, make_optimizer_step=True)

    def configure_optimizers(self) -> tuple[torch.optim.Adam, torch.optim.SGD]:
        return (
            torch.optim.Adam(self.generator.parameters(), lr=0.01),
            torch.optim.SGD(self.discriminator.parameters(), lr=0.05),
        )


class QuietStrategy(ReferenceSingleDeviceStrategy):
    """A user's subclass of a twin strategy: a class, not ``Any``."""

    def context_or_fail(self) -> TrainingContext:
        context = self.reference_context
        if context is None:
            raise RuntimeError("no fit is running")
        return context


def trainers() -> list[Trainer]:
    assert_type(STRATEGY_NAMES, tuple[str, ...])
    single = QuietStrategy(grad_scaler=GradScalerSettings(init_scale=2.0**10))
    ddp = ReferenceDDPStrategy(find_unused_parameters=True)
    return [
        Trainer(strategy=single, accelerator="cpu", precision="16-mixed"),
        Trainer(strategy=ddp, accelerator="cpu", devices=2),
        Trainer(strategy="reference", accelerator="cpu"),
    ]
