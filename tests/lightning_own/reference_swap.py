"""pytest plugin for Lightning's own tests: every single-device CPU ``Trainer`` runs the reference's strategy.

A ``Trainer`` built with the default ``strategy="auto"``, on one device (``devices`` left out, ``1``, ``"1"`` or
``[0]``) and the CPU (``accelerator`` left out or ``"cpu"``), each also as the ``PL_TRAINER_*`` environment variables
that Lightning reads set it, gets ``ReferenceSingleDeviceStrategy()``; every other
``Trainer`` is left as its test wrote it. Loaded with ``-p reference_swap`` by ``scripts/lightning-own-tests``, after
``-p xla_first`` as on the plain side. The Trainer and the strategy are those of the Lightning namespace the harness
runs (``LIGHTNING_NAMESPACE``): ``lightning.pytorch``'s and ``lightning_optimizer.reference.lightning``'s, or
``pytorch_lightning``'s and ``lightning_optimizer.reference.pytorch_lightning``'s.
"""

from __future__ import annotations

import functools
import importlib
import os
from typing import Any

NAMESPACES = {
    "lightning": ("lightning.pytorch", "lightning_optimizer.reference.lightning"),
    "pytorch_lightning": ("pytorch_lightning", "lightning_optimizer.reference.pytorch_lightning"),
}
"""A namespace -> the module of its ``Trainer``, and the reference's package for it."""

_trainer_module, _reference = NAMESPACES[os.environ.get("LIGHTNING_NAMESPACE", "lightning") or "lightning"]
Trainer: Any = importlib.import_module(_trainer_module).Trainer
ReferenceSingleDeviceStrategy: Any = importlib.import_module(_reference).ReferenceSingleDeviceStrategy

SWAPPED: list[Any] = []
"""The Trainers that got the reference's strategy, in order."""

_lightning_init = Trainer.__init__


def _argument(kwargs: dict[str, Any], name: str) -> Any:
    """A Trainer argument as Lightning resolves it: given, else from ``PL_TRAINER_<NAME>``, else ``"auto"``."""
    return kwargs.get(name, os.environ.get(f"PL_TRAINER_{name.upper()}", "auto"))


def _single_device(kwargs: dict[str, Any]) -> bool:
    return (
        _argument(kwargs, "strategy") == "auto"
        and _argument(kwargs, "devices") in ("auto", 1, "1", [0])
        and _argument(kwargs, "accelerator") in ("auto", "cpu")
    )


@functools.wraps(_lightning_init)
def _init(self: Any, *args: Any, **kwargs: Any) -> None:
    if _single_device(kwargs):
        kwargs["strategy"] = ReferenceSingleDeviceStrategy()
        SWAPPED.append(self)
    _lightning_init(self, *args, **kwargs)


Trainer.__init__ = _init
