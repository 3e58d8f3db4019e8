"""A framework's hooks on a training context: typed by the spec's hook aliases, removed through the handle."""

from __future__ import annotations

from typing import Any

import torch

from lightning_optimizer.spec import HookHandle, OptimizerWrapper, StepOutcome, TrainingContext


class GlobalStep:
    """Counts the optimizer steps applied and logs each real step's gradient norm, as a framework's loop does."""

    def __init__(self) -> None:
        self.steps = 0
        self.norms: list[float] = []

    def before_optimizer_step(self, wrapper: OptimizerWrapper[Any]) -> None:
        grads = [p.grad for group in wrapper.param_groups for p in group["params"] if p.grad is not None]
        self.norms.append(float(torch.nn.utils.get_total_norm(grads)))

    def after_step(self, wrapper: OptimizerWrapper[Any], outcome: StepOutcome) -> None:
        if outcome is StepOutcome.STEPPED:
            self.steps += 1


def attach(context: TrainingContext, counter: GlobalStep) -> HookHandle:
    def before_backward(wrapper: OptimizerWrapper[Any], loss: torch.Tensor) -> None:
        assert loss.requires_grad

    return context.register_hooks(
        before_backward=before_backward,
        before_optimizer_step=counter.before_optimizer_step,
        after_step=counter.after_step,
    )


def detach(handle: HookHandle) -> None:
    handle.remove()
