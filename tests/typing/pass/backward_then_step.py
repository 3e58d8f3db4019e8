"""The backward-then-step form, and ``toggle_model`` around a micro-step that does not sync gradients."""

from __future__ import annotations

import torch

from lightning_optimizer.spec import OptimizerWrapper, StepOutcome


def training_step(
    model: torch.nn.Module, opt: OptimizerWrapper[torch.optim.SGD], x: torch.Tensor, y: torch.Tensor
) -> StepOutcome | None:
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.backward(loss)
    opt.step()
    return opt.last_outcome


def accumulate_without_sync(
    model: torch.nn.Module, opt: OptimizerWrapper[torch.optim.SGD], x: torch.Tensor, y: torch.Tensor, batch_idx: int
) -> None:
    is_last_micro_step = batch_idx % 4 == 3
    with opt.toggle_model(sync_grad=is_last_micro_step):
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.backward(loss)
    opt.step(make_optimizer_step=is_last_micro_step)
    if is_last_micro_step:
        opt.zero_grad(set_to_none=True)


def no_sync_block(model: torch.nn.Module, opt: OptimizerWrapper[torch.optim.SGD], x: torch.Tensor) -> None:
    with opt.toggle_model(sync_grad=False):
        opt.backward(model(x).sum())
    with opt.toggle_model():
        opt.backward(model(x).sum())
    opt.step(make_optimizer_step=False)
    lr: float = opt.param_groups[0]["lr"]
    opt.optimizer.param_groups[0]["lr"] = lr
