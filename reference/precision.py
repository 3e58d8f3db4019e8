"""Precision: how each precision casts the module, and where forward and backward passes run relative to autocast.

Autocast as torch's AMP recipe and Lightning use it: the region's weight cache off, so that a forward after a real
step in the same region casts the new parameters [PREC-004], and every backward of the context outside the region
[BWD-002]. Loss scaling is in :mod:`.amp`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

import torch

from lightning_optimizer.spec.types import PRECISIONS, Precision

__all__ = ["SUPPORTED_PRECISIONS", "PrecisionPlugin", "outside_autocast", "resolve_precision"]


_NO_AUTOCAST = nullcontext()
"""The forward-pass region of the true precisions (``nullcontext`` is stateless, so one instance serves all)."""


@dataclass(frozen=True)
class PrecisionPlugin:
    """One precision: the dtype parameters live in, the autocast dtype (mixed only), whether losses are scaled."""

    name: Precision
    param_dtype: torch.dtype
    autocast_dtype: torch.dtype | None = None
    scales_loss: bool = False

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module's floating-point parameters and buffers to the parameter dtype."""
        return module.to(dtype=self.param_dtype)

    def autocast(self, device: torch.device) -> AbstractContextManager[None]:
        """The forward-pass region: autocast to the mixed dtype, or nothing for a true precision.

        Its weight cache is off (``cache_enabled=False``): with it on, autocast casts each parameter once per region
        and a forward after a real step in the same region would use the parameters before that step [PREC-004].
        """
        if self.autocast_dtype is None:
            return _NO_AUTOCAST
        return torch.autocast(device_type=device.type, dtype=self.autocast_dtype, cache_enabled=False)

    def check_parameter(self, param: torch.Tensor) -> None:
        """Refuse a floating-point parameter that is not in the parameter dtype."""
        if param.is_floating_point() and param.dtype != self.param_dtype:
            raise ValueError(
                f"precision {self.name!r} needs {self.param_dtype} parameters, but the optimizer holds a "
                f"{param.dtype} parameter: call context.prepare_module(model) before building the optimizer on "
                "its parameters"
            )


def outside_autocast(device: torch.device) -> AbstractContextManager[None]:
    """Where a backward runs: autocast disabled on ``device`` if a region (anyone's) enabled it there [BWD-002].

    torch's AMP recipe runs backward passes outside autocast (their ops would otherwise be autocast too, e.g. the
    backward of a float32 block that the forward ran with autocast disabled). Outside any region this costs one check.
    """
    if torch.is_autocast_enabled(device.type):
        return torch.autocast(device_type=device.type, enabled=False)
    return _NO_AUTOCAST


_PLUGINS: dict[str, PrecisionPlugin] = {
    "64-true": PrecisionPlugin("64-true", torch.float64),
    "32-true": PrecisionPlugin("32-true", torch.float32),
    "bf16-true": PrecisionPlugin("bf16-true", torch.bfloat16),
    "bf16-mixed": PrecisionPlugin("bf16-mixed", torch.float32, autocast_dtype=torch.bfloat16),
    "16-mixed": PrecisionPlugin("16-mixed", torch.float32, autocast_dtype=torch.float16, scales_loss=True),
}

SUPPORTED_PRECISIONS: frozenset[Precision] = frozenset(plugin.name for plugin in _PLUGINS.values())


def resolve_precision(name: object) -> PrecisionPlugin:
    """The plugin for a precision name; a ``ValueError`` names the valid ones otherwise."""
    plugin = _PLUGINS.get(name) if isinstance(name, str) else None
    if plugin is None:
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    return plugin
