"""The GAN example: two wrappers over one model, stepped on different schedules.

``training_step`` is written against the protocol only; ``main`` runs it with the reference implementation,
whose wrappers are assigned to ``OptimizerWrapper[torch.optim.Adam]`` variables.
"""

from __future__ import annotations

import torch

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import OptimizerWrapper, StepOutcome
from lightning_optimizer.spec import TrainingContext as TrainingContextProtocol

LATENT = 4
FEATURES = 2


class GAN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.generator = torch.nn.Sequential(torch.nn.Linear(LATENT, 8), torch.nn.Tanh(), torch.nn.Linear(8, FEATURES))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(FEATURES, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def training_step(
    model: GAN,
    opt_gen: OptimizerWrapper[torch.optim.Adam],
    opt_dis: OptimizerWrapper[torch.optim.Adam],
    real: torch.Tensor,
    batch_idx: int,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    bce = torch.nn.functional.binary_cross_entropy_with_logits
    z = torch.randn(real.shape[0], LATENT)

    def gen_closure() -> torch.Tensor:
        fake = model.generator(z)
        logits = model.discriminator(fake)
        loss = bce(logits, torch.ones_like(logits))
        opt_gen.backward(loss)
        return loss

    # Generator: a real step every 2 batches; gradients accumulate in between.
    gen_loss = opt_gen.step(closure=gen_closure, make_optimizer_step=batch_idx % 2 == 0)

    def dis_closure() -> torch.Tensor:
        fake = model.generator(z).detach()
        real_logits = model.discriminator(real)
        fake_logits = model.discriminator(fake)
        loss = bce(real_logits, torch.ones_like(real_logits)) + bce(fake_logits, torch.zeros_like(fake_logits))
        opt_dis.backward(loss)
        return loss

    # Discriminator: updated every 4 batches.
    dis_loss: torch.Tensor | None = None
    if batch_idx % 4 == 0:
        dis_loss = opt_dis.step(closure=dis_closure, make_optimizer_step=True)
    return gen_loss, dis_loss


def main(batches: int = 8) -> dict[str, list[StepOutcome | None]]:
    """Run ``batches`` iterations on CPU with the reference.

    Returns each wrapper's ``last_outcome`` after each batch, ``None`` for the discriminator on the batches
    where it is not stepped.
    """
    torch.manual_seed(0)
    ctx = TrainingContext(precision="32-true", device="cpu", accumulate_grad_batches=1)
    as_protocol: TrainingContextProtocol = ctx
    del as_protocol
    model = GAN()
    ctx.prepare_module(model)
    opt_gen: OptimizerWrapper[torch.optim.Adam] = ctx.wrap(torch.optim.Adam(model.generator.parameters(), lr=1e-2))
    opt_dis: OptimizerWrapper[torch.optim.Adam] = ctx.wrap(torch.optim.Adam(model.discriminator.parameters(), lr=1e-2))
    outcomes: dict[str, list[StepOutcome | None]] = {"gen": [], "dis": []}
    for batch_idx in range(batches):
        real = torch.randn(16, FEATURES) * 0.5 + 1.0
        with ctx.batch(batch_idx, is_last=batch_idx == batches - 1):
            gen_loss, dis_loss = training_step(model, opt_gen, opt_dis, real, batch_idx)
        if not torch.isfinite(gen_loss):
            raise RuntimeError(f"generator loss is not finite at batch {batch_idx}")
        if dis_loss is not None and not torch.isfinite(dis_loss):
            raise RuntimeError(f"discriminator loss is not finite at batch {batch_idx}")
        outcomes["gen"].append(opt_gen.last_outcome)
        outcomes["dis"].append(None if dis_loss is None else opt_dis.last_outcome)
    return outcomes


if __name__ == "__main__":
    print(main())
