"""Devices: where the model lives, and what a device adds around a real step (XLA's reduction and graph cut)."""

from __future__ import annotations

import importlib.util
import os

import torch
import torch.distributed as dist

from lightning_optimizer.spec.types import DEVICE_KINDS

__all__ = ["SUPPORTED_DEVICES", "Device", "resolve_device"]

SUPPORTED_DEVICES = frozenset({"cpu", "cuda", "xla"})


class Device:
    """CPU or CUDA: nothing around the step (DDP reduces gradients during backward)."""

    reduces_gradients = False
    """Whether :meth:`reduce_gradients` changes gradients (replicas are reduced outside backward)."""
    accumulates_in_place = True
    """Whether a window's gradients may be added in place into a backward's fresh gradients."""

    def __init__(self, torch_device: torch.device) -> None:
        self.torch_device = torch_device

    def reduce_gradients(self, optimizer: torch.optim.Optimizer) -> None:
        """Reduce the window's gradients across replicas, where the device does that outside backward."""

    def after_step(self) -> None:
        """Finish a real step on the device."""


def resolve_device(kind: object) -> Device:
    """The device for a device kind; raise with what is missing when it cannot be used here."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device {kind!r}; expected one of {', '.join(DEVICE_KINDS)}")
    if kind == "xla":
        if importlib.util.find_spec("torch_xla") is None:
            raise ModuleNotFoundError(
                "device 'xla' needs torch_xla, which is not installed: pip install 'lightning-optimizer[xla]'"
            )
        from lightning_optimizer.reference.xla import XlaDevice

        return XlaDevice()
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was requested but torch finds no CUDA device on this machine")
        index = torch.cuda.current_device()
        if dist.is_available() and dist.is_initialized():
            index = int(os.environ.get("LOCAL_RANK", dist.get_rank())) % torch.cuda.device_count()
            torch.cuda.set_device(index)
        return Device(torch.device("cuda", index))
    return Device(torch.device("cpu"))
