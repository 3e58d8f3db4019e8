"""The GAN of the checks of toggling and autocast: its model, batches and losses, a wrapper's call, its plain loop.

The discriminator records, through :func:`probe`, whether autocast was on in each backward pass through it. The
discriminator's loss runs the generator again: after the generator's step, that forward sees its new parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, nullcontext
from functools import partial
from typing import Any

import torch

from lightning_optimizer.conformance.harness import (
    cell_device,
    cell_dtype,
    oracle_autocast,
    oracle_scaler,
    oracle_step_done,
)
from lightning_optimizer.conformance.optimizer_kinds import frozen
from lightning_optimizer.conformance.plain_loop import real_step, scaled_backward, update_scaler
from lightning_optimizer.spec import Cell, OptimizerWrapper

__all__ = ["Gan", "dis_loss", "gan_batches", "gan_call", "gen_loss", "plain_gan", "probe"]

GanBatch = tuple[torch.Tensor, torch.Tensor]
Region = Callable[[], AbstractContextManager[Any]]


class _AutocastProbe(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, tensor: torch.Tensor, seen: list[bool]) -> torch.Tensor:
        ctx.seen = seen
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        ctx.seen.append(torch.is_autocast_enabled(grad.device.type))
        return grad, None


def probe(tensor: torch.Tensor, seen: list[bool]) -> torch.Tensor:
    """The identity; each backward pass through it appends to ``seen`` whether autocast was on for its device."""
    out: torch.Tensor = _AutocastProbe.apply(tensor, seen)  # type: ignore[no-untyped-call]
    return out


class Gan(torch.nn.Module):
    """A seeded generator (3 to 4 features) and discriminator (4 to 1); ``seen`` is the discriminator's probe."""

    def __init__(self) -> None:
        super().__init__()
        generator = torch.Generator().manual_seed(17)
        self.generator = torch.nn.Sequential(torch.nn.Linear(3, 6), torch.nn.Tanh(), torch.nn.Linear(6, 4))
        self.discriminator = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
        with torch.no_grad():
            for param in self.parameters():
                param.copy_(torch.randn(param.shape, generator=generator) * 0.5)
        self.seen: list[bool] = []

    def judge(self, samples: torch.Tensor) -> torch.Tensor:
        """The discriminator's verdict on ``samples``, through the probe."""
        judged: torch.Tensor = self.discriminator(probe(samples, self.seen))
        return judged


def gen_loss(gan: Gan, noise: torch.Tensor) -> torch.Tensor:
    """The generator's loss: its samples judged fake."""
    return torch.nn.functional.softplus(-gan.judge(gan.generator(noise)).float()).mean()


def dis_loss(gan: Gan, noise: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
    """The discriminator's loss on ``real`` and on the generator's samples, generated anew (detached)."""
    fake = gan.generator(noise).detach()
    real_term = torch.nn.functional.softplus(-gan.judge(real).float()).mean()
    return real_term + torch.nn.functional.softplus(gan.judge(fake).float()).mean()


def gan_batches(cell: Cell, count: int) -> list[GanBatch]:
    """``count`` seeded ``(noise, real)`` batches of 6, on the cell's device and in its parameter dtype."""
    generator = torch.Generator().manual_seed(29)
    device, dtype = cell_device(cell), cell_dtype(cell)
    return [
        (
            torch.randn(6, 3, generator=generator).to(device, dtype),
            (torch.randn(6, 4, generator=generator) + 1.0).to(device, dtype),
        )
        for _ in range(count)
    ]


def gan_call(
    wrapper: OptimizerWrapper[Any],
    loss_of: Callable[[], torch.Tensor],
    make_optimizer_step: bool,
    form: str = "closure",
    region: Region = nullcontext,
) -> None:
    """One wrapper's call on ``loss_of()``, by ``form``.

    ``"closure"``: ``step(closure)`` whose closure runs the forward in ``region()``, then ``wrapper.backward``;
    ``"toggle"``: the forward and ``wrapper.backward`` in ``toggle_model()``, then ``step()``.
    """
    if form == "closure":

        def closure() -> torch.Tensor:
            with region():
                loss = loss_of()
            wrapper.backward(loss)
            return loss

        wrapper.step(closure, make_optimizer_step=make_optimizer_step)
        return
    with wrapper.toggle_model():
        wrapper.backward(loss_of())
    wrapper.step(make_optimizer_step=make_optimizer_step)


def plain_gan(
    gan: Gan,
    optimizers: tuple[torch.optim.Optimizer, torch.optim.Optimizer],
    batches: Sequence[GanBatch],
    cell: Cell,
    gen_closes: Sequence[bool],
    dis_steps: Sequence[bool],
    region: Region = nullcontext,
) -> Iterator[list[bool]]:
    """The plain GAN loop, batch by batch, in ``region()``; yields whether each real step of the batch stepped.

    The generator's backward every batch, its window's mean stepped where ``gen_closes``; then, where ``dis_steps``,
    the discriminator's backward and step. Each forward runs under the cell's plain autocast, each backward outside
    it with the other half toggled off by hand; under 16-mixed one plain GradScaler serves both, updated once after
    each batch in which one stepped.
    """
    scaler, window = oracle_scaler(cell), 0
    device_type = cell_device(cell).type

    def backward(loss_of: Callable[[], torch.Tensor], other: torch.nn.Module) -> None:
        with frozen(other.parameters()):
            with oracle_autocast(cell):
                loss = loss_of()
            with torch.autocast(device_type, enabled=False):
                scaled_backward(loss, scaler)

    for (noise, real), closes, dis in zip(batches, gen_closes, dis_steps, strict=True):
        stepped = []
        with region():
            backward(partial(gen_loss, gan, noise), gan.discriminator)
            window += 1
            if closes:
                stepped.append(real_step(optimizers[0], window, scaler, check_finite=scaler is not None))
                window = 0
            if dis:
                backward(partial(dis_loss, gan, noise, real), gan.generator)
                stepped.append(real_step(optimizers[1], 1, scaler, check_finite=scaler is not None))
        if stepped:
            update_scaler(scaler)
        oracle_step_done(cell)
        yield stepped
