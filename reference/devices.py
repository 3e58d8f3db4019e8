"""Device resolution: turn a device kind into a ``torch.device``, or say why this machine cannot."""

from __future__ import annotations

import importlib.util

import torch

from lightning_optimizer.spec.types import DEVICE_KINDS

__all__ = ["SUPPORTED_DEVICES", "resolve_device"]

SUPPORTED_DEVICES = frozenset({"cpu", "cuda"})


def resolve_device(kind: object) -> torch.device:
    """The ``torch.device`` for a device kind; raise with what is missing when it cannot be used here."""
    if kind not in DEVICE_KINDS:
        raise ValueError(f"unknown device {kind!r}; expected one of {', '.join(DEVICE_KINDS)}")
    if kind == "xla":
        if importlib.util.find_spec("torch_xla") is None:
            raise ModuleNotFoundError(
                "device 'xla' needs torch_xla, which is not installed: pip install 'lightning-optimizer[xla]'"
            )
        raise ValueError(
            "device 'xla' is part of the contract but not supported by this version of the reference; "
            f"supported: {', '.join(sorted(SUPPORTED_DEVICES))}"
        )
    if kind == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device 'cuda' was requested but torch finds no CUDA device on this machine")
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
