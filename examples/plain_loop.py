"""The README's quickstart: the proposal's GAN in a plain PyTorch loop, the reference without Lightning.

The generator accumulates its gradients over 2 batches, the discriminator steps every 4 batches. Prints one
summary line.
"""

from __future__ import annotations

import torch

from lightning_optimizer.reference import TrainingContext
from lightning_optimizer.spec import StepOutcome

BATCHES = 8


def main() -> str:
    torch.manual_seed(0)
    ctx = TrainingContext(precision="32-true", device="cpu")
    gen = ctx.prepare_module(torch.nn.Linear(8, 16))
    dis = ctx.prepare_module(torch.nn.Linear(16, 1))
    opt_gen = ctx.wrap(torch.optim.Adam(gen.parameters(), lr=1e-3))
    opt_dis = ctx.wrap(torch.optim.SGD(dis.parameters(), lr=1e-2))
    outcomes: dict[str, list[StepOutcome | None]] = {"gen": [], "dis": []}

    for batch_idx in range(BATCHES):
        with ctx.batch(batch_idx, is_last=batch_idx == BATCHES - 1):
            noise, real = torch.randn(4, 8), torch.randn(4, 16)

            def gen_closure(noise: torch.Tensor = noise) -> None:
                with ctx.autocast():
                    loss_gen = -dis(gen(noise)).mean()
                opt_gen.backward(loss_gen)

            def dis_closure(noise: torch.Tensor = noise, real: torch.Tensor = real) -> None:
                with ctx.autocast():
                    loss_dis = dis(gen(noise).detach()).mean() - dis(real).mean()
                opt_dis.backward(loss_dis)

            # accumulate generator gradients over 2 batches, then step
            opt_gen.step(closure=gen_closure, make_optimizer_step=batch_idx % 2 == 0)
            outcomes["gen"].append(opt_gen.last_outcome)
            # discriminator every 4 batches, no accumulation
            if batch_idx % 4 == 0:
                opt_dis.step(closure=dis_closure, make_optimizer_step=True)
                outcomes["dis"].append(opt_dis.last_outcome)

    stepped = {name: seen.count(StepOutcome.STEPPED) for name, seen in outcomes.items()}
    return (
        f"plain loop, {ctx.precision} on {ctx.device}: {BATCHES} batches, generator stepped {stepped['gen']} times "
        f"(the window of batch 7 stays open), discriminator {stepped['dis']} times"
    )


if __name__ == "__main__":
    print(main())
