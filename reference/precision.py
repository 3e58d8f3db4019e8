"""Precision: how each precision casts the module, and where forward and backward passes run relative to autocast.

Module casting as Lightning's precision plugins do it: 64-true as ``module.double()``, the ``-true`` half precisions
as ``module.to(dtype)``, 32-true and the mixed precisions not at all [PREC-001, PREC-002]. Autocast as torch's AMP
recipe and Lightning use it: the region's weight cache off, so that a forward after a real
step in the same region casts the new parameters [PREC-004], and every backward of the context outside the region
[BWD-002]. Loss scaling is in :mod:`.amp`.
"""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from types import TracebackType

import torch

from lightning_optimizer.spec.types import PRECISIONS, Precision

__all__ = [
    "NO_AUTOCAST",
    "SUPPORTED_PRECISIONS",
    "PrecisionPlugin",
    "check_no_complex",
    "outside_autocast",
    "resolve_precision",
]


NO_AUTOCAST = nullcontext()
"""The region of the true precisions, and outside any region the block a backward runs in: nothing to enter
(``nullcontext`` is stateless, so one instance serves all)."""


@dataclass(frozen=True)
class PrecisionPlugin:
    """One precision: the dtype it casts the module to, the autocast dtype (mixed only), whether losses are scaled.

    ``param_dtype`` is the floating-point dtype ``prepare_module`` casts to: float64 in 64-true, bfloat16 and float16
    in the ``-true`` half precisions; ``None`` in 32-true and the mixed precisions, which convert nothing, as
    Lightning's plugins do [PREC-001, PREC-002].
    """

    name: Precision
    param_dtype: torch.dtype | None
    autocast_dtype: torch.dtype | None = None
    scales_loss: bool = False

    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        """Cast the module as Lightning's plugin for the precision does (in place) [PREC-001, PREC-002].

        64-true: floating-point tensors to float64, as ``module.double()`` (complex and integer ones kept). The
        ``-true`` half precisions: ``module.to(dtype)``, which would also cast complex tensors and discard their
        imaginary part, so a complex parameter or buffer is refused first. The others: nothing.
        """
        dtype = self.param_dtype
        if dtype is None:
            return module
        if dtype is torch.float64:
            return module.double()
        check_no_complex(module, self.name, dtype)
        return module.to(dtype=dtype)

    def autocast(self, device: torch.device) -> AbstractContextManager[None]:
        """The forward-pass region: autocast to the mixed dtype, or nothing for a true precision.

        Its weight cache is off (``cache_enabled=False``): with it on, autocast casts each parameter once per region
        and a forward after a real step in the same region would use the parameters before that step [PREC-004].
        Built inside the same region already (the user's ``context.autocast()`` in the closure the context runs in
        its region), it enters a region only if that one is gone when it is entered.
        """
        dtype = self.autocast_dtype
        if dtype is None:
            return NO_AUTOCAST
        kind = device.type
        same = torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) is dtype
        if same and not torch.is_autocast_cache_enabled():
            return _RegionUnlessInside(kind, dtype)
        return torch.autocast(device_type=kind, dtype=dtype, cache_enabled=False)

    def check_parameter(self, param: torch.Tensor) -> None:
        """Refuse a floating-point parameter in a dtype this precision does not train [ERR-007]."""
        if not param.is_floating_point():
            return
        if self.param_dtype is not None and param.dtype != self.param_dtype:
            raise ValueError(
                f"precision {self.name!r} needs {self.param_dtype} parameters, but the optimizer holds a "
                f"{param.dtype} parameter: call context.prepare_module(model) before building the optimizer on "
                "its parameters"
            )
        if self.scales_loss and param.dtype == torch.float16:
            raise ValueError(
                f"precision {self.name!r} scales the loss with torch.amp.GradScaler, which cannot unscale the "
                "gradients of a torch.float16 parameter: keep the module's parameters in float32 (16-mixed runs the "
                "forward in float16 under autocast), or use precision '16-true' for float16 weights"
            )


class _RegionUnlessInside(AbstractContextManager[None]):
    """The forward-pass region, built inside the same region: entered only if, when entered, that region is gone."""

    __slots__ = ("dtype", "kind", "region")

    def __init__(self, kind: str, dtype: torch.dtype) -> None:
        self.kind, self.dtype = kind, dtype
        self.region: torch.autocast | None = None

    def __enter__(self) -> None:
        kind, dtype = self.kind, self.dtype
        same = torch.is_autocast_enabled(kind) and torch.get_autocast_dtype(kind) is dtype
        if same and not torch.is_autocast_cache_enabled():
            return  # the same region: entering it again would change nothing
        self.region = torch.autocast(device_type=kind, dtype=dtype, cache_enabled=False)
        self.region.__enter__()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        region, self.region = self.region, None
        if region is not None:
            region.__exit__(exc_type, exc, traceback)


def check_no_complex(module: torch.nn.Module, precision: str, dtype: torch.dtype) -> None:
    """Refuse a module with a complex parameter or buffer, which ``module.to(dtype)`` would make real [PREC-002]."""
    named = [
        *(("parameter", name, tensor) for name, tensor in module.named_parameters()),
        *(("buffer", name, tensor) for name, tensor in module.named_buffers()),
    ]
    for kind, name, tensor in named:
        if tensor.is_complex():
            raise ValueError(
                f"precision {precision!r} casts the module with module.to({dtype}), which would discard the imaginary "
                f"part of its complex {kind} {name!r} ({tensor.dtype}); keep complex values out of the module's "
                "parameters and buffers (compute them in forward), or use a precision that keeps them (32-true, "
                "64-true or a mixed one)"
            )


def outside_autocast(device: torch.device) -> AbstractContextManager[None]:
    """Where a backward runs: autocast disabled on ``device`` if a region (anyone's) enabled it there [BWD-002].

    torch's AMP recipe runs backward passes outside autocast (their ops would otherwise be autocast too, e.g. the
    backward of a float32 block that the forward ran with autocast disabled). Outside any region this costs one check;
    inside one, the device's autocast flag is off for the block and restored after it (the region's dtype, cache and
    nesting untouched, as ``torch.autocast(enabled=False)`` leaves them).
    """
    kind = device.type
    if torch.is_autocast_enabled(kind):
        return _AutocastOff(kind)
    return NO_AUTOCAST


class _AutocastOff(AbstractContextManager[None]):
    """Autocast disabled on one device type inside the block, as it was after it (a backward's few calls)."""

    __slots__ = ("kind", "was_enabled")

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.was_enabled = True

    def __enter__(self) -> None:
        self.was_enabled = torch.is_autocast_enabled(self.kind)
        torch.set_autocast_enabled(self.kind, False)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, traceback: TracebackType | None
    ) -> None:
        torch.set_autocast_enabled(self.kind, self.was_enabled)


_PLUGINS: dict[str, PrecisionPlugin] = {
    "64-true": PrecisionPlugin("64-true", torch.float64),
    "32-true": PrecisionPlugin("32-true", None),
    "bf16-true": PrecisionPlugin("bf16-true", torch.bfloat16),
    "16-true": PrecisionPlugin("16-true", torch.float16),
    "bf16-mixed": PrecisionPlugin("bf16-mixed", None, autocast_dtype=torch.bfloat16),
    "16-mixed": PrecisionPlugin("16-mixed", None, autocast_dtype=torch.float16, scales_loss=True),
}

SUPPORTED_PRECISIONS: frozenset[Precision] = frozenset(plugin.name for plugin in _PLUGINS.values())


def resolve_precision(name: object) -> PrecisionPlugin:
    """The plugin for a precision name; a ``ValueError`` names the valid ones otherwise."""
    plugin = _PLUGINS.get(name) if isinstance(name, str) else None
    if plugin is None:
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}")
    return plugin
