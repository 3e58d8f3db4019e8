"""A user's ``training_step`` written against the protocol, in the closure form."""

from __future__ import annotations

import torch

from lightning_optimizer.spec import OptimizerWrapper


def training_step(
    model: torch.nn.Module,
    opt: OptimizerWrapper[torch.optim.SGD],
    batch: tuple[torch.Tensor, torch.Tensor],
    batch_idx: int,
) -> torch.Tensor:
    x, y = batch

    def closure() -> torch.Tensor:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.backward(loss)
        return loss

    loss = opt.step(closure=closure, make_optimizer_step=batch_idx % 2 == 0)
    return loss.detach()


def training_step_positional(
    model: torch.nn.Module, opt: OptimizerWrapper[torch.optim.SGD], x: torch.Tensor, y: torch.Tensor
) -> float:
    def closure() -> float:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.backward(loss, retain_graph=False)
        return loss.item()

    # Positional closure, the context's schedule (None), and kwargs for the inner step.
    first: float = opt.step(closure)
    second: float = opt.step(closure, None)
    return first + second
