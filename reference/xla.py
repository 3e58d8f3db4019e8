"""XLA (TPU, and XLA's CPU backend): one gradient reduction per real step, then the step, then one graph cut."""

from __future__ import annotations

import torch
import torch_xla
import torch_xla.core.xla_model as xm

from lightning_optimizer.reference.devices import Device

__all__ = ["XlaDevice", "runtime_devices"]


def runtime_devices() -> tuple[str | None, int]:
    """The device type torch_xla's PJRT runtime runs (``"TPU"``, ``"CPU"``, ...) and how many devices it addresses."""
    import torch_xla.runtime as xr

    return xr.device_type(), xr.addressable_runtime_device_count()


class XlaDevice(Device):
    """The current XLA device of this process."""

    reduces_gradients = True
    accumulates_in_place = False  # an in-place add into a gradient that is an expanded view reads wrong values

    def __init__(self) -> None:
        super().__init__(torch.device(torch_xla.device()))

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """All-reduce the gradients across XLA replicas (torch_xla does nothing with one replica).

        After torch_xla's in-place all-reduce, a view taken of a gradient that was changed in place before (the
        window's sum, its division) still reads the unreduced values, and ``clip_grad_norm_`` (which torch_xla
        replaces with its own) writes through such views: each gradient is rebound to a fresh tensor, so whatever
        comes next sees the reduced one. An optimizer without any gradient is left alone (torch_xla's all-reduce of
        an empty list aborts the process).
        """
        params = [param for group in optimizer.param_groups for param in group["params"] if param.grad is not None]
        if not params:
            return
        xm.reduce_gradients(optimizer)
        for param in params:
            assert param.grad is not None
            param.grad = param.grad.clone()

    def after_step(self) -> None:
        """Cut the lazy graph once, so that the step executes."""
        torch_xla.sync()
