"""Precision handling: how a precision casts the module, runs the forward pass and backpropagates."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from lightning_optimizer.spec.types import PRECISIONS, Precision

__all__ = ["SUPPORTED_PRECISIONS", "PrecisionPlugin", "resolve_precision"]


@dataclass(frozen=True)
class PrecisionPlugin:
    """A true (non-mixed) precision: parameters in ``dtype``, no autocast, no loss scaling."""

    name: Precision
    dtype: torch.dtype

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module's floating-point parameters and buffers to this precision's dtype."""
        return module.to(dtype=self.dtype)

    def autocast(self) -> AbstractContextManager[None]:
        """No autocast region in a true precision."""
        return nullcontext()

    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """Plain ``loss.backward``."""
        backward: Callable[..., None] = loss.backward
        backward(*args, **kwargs)

    def check_parameter(self, param: torch.Tensor) -> None:
        """Refuse a floating-point parameter that is not in this precision's dtype."""
        if param.is_floating_point() and param.dtype != self.dtype:
            raise ValueError(
                f"precision {self.name!r} needs {self.dtype} parameters, but the optimizer holds a {param.dtype} "
                "parameter: call context.prepare_module(model) before building the optimizer on its parameters"
            )


_PLUGINS: dict[str, PrecisionPlugin] = {
    "64-true": PrecisionPlugin("64-true", torch.float64),
    "32-true": PrecisionPlugin("32-true", torch.float32),
}

SUPPORTED_PRECISIONS: frozenset[Precision] = frozenset(plugin.name for plugin in _PLUGINS.values())


def resolve_precision(name: object) -> PrecisionPlugin:
    """The plugin for a precision name; a ``ValueError`` names the valid ones otherwise."""
    if name not in PRECISIONS:
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    plugin = _PLUGINS.get(str(name))
    if plugin is None:
        raise ValueError(
            f"precision {name!r} is part of the contract but not supported by this version of the reference; "
            f"supported: {', '.join(sorted(SUPPORTED_PRECISIONS))}"
        )
    return plugin
