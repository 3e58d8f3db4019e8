"""pytest plugin for Lightning's own tests: every single-device CPU ``Trainer`` runs the reference's strategy.

A ``Trainer`` built with the default ``strategy="auto"``, on one device (``devices`` left out, ``1``, ``"1"`` or
``[0]``) and the CPU (``accelerator`` left out or ``"cpu"``), gets ``ReferenceSingleDeviceStrategy()``; every other
``Trainer`` is left as its test wrote it. Loaded with ``-p reference_swap`` by ``scripts/lightning-own-tests``.
torch_xla is imported first when installed: Lightning's accelerator discovery imports it inside a test, which sets
environment variables that the tests' own leak check would blame on that test.
"""

from __future__ import annotations

import functools
import importlib.util
from typing import Any

from pytorch_lightning import Trainer

from lightning_optimizer.reference.lightning import ReferenceSingleDeviceStrategy

if importlib.util.find_spec("torch_xla") is not None:
    import torch_xla  # noqa: F401

SWAPPED: list[Trainer] = []
"""The Trainers that got the reference's strategy, in order."""

_lightning_init = Trainer.__init__


def _single_device(kwargs: dict[str, Any]) -> bool:
    return (
        kwargs.get("strategy", "auto") == "auto"
        and kwargs.get("devices", "auto") in ("auto", 1, "1", [0])
        and kwargs.get("accelerator", "auto") in ("auto", "cpu")
    )


@functools.wraps(_lightning_init)
def _init(self: Trainer, *args: Any, **kwargs: Any) -> None:
    if _single_device(kwargs):
        kwargs["strategy"] = ReferenceSingleDeviceStrategy()
        SWAPPED.append(self)
    _lightning_init(self, *args, **kwargs)


Trainer.__init__ = _init  # type: ignore[method-assign]
