"""XLA (TPU, and XLA's CPU backend): one gradient reduction per real step, then the step, then one graph cut."""

from __future__ import annotations

import torch
import torch_xla
import torch_xla.core.xla_model as xm

from lightning_optimizer.reference.devices import Device

__all__ = ["XlaDevice"]


class XlaDevice(Device):
    """The current XLA device of this process."""

    def __init__(self) -> None:
        super().__init__(torch.device(torch_xla.device()))

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """All-reduce the gradients across XLA replicas (torch_xla does nothing with one replica)."""
        xm.reduce_gradients(optimizer)

    def after_step(self) -> None:
        """Cut the lazy graph once, so that the step executes."""
        torch_xla.sync()
