"""PREC-001 broken: ``prepare_module`` casts every buffer to the precision's dtype, integer ones included.

The implementer writes the cast as a loop over ``module.parameters()`` and ``module.buffers()`` (``t.data =
t.data.to(dtype)``) instead of ``module.to(dtype)``, which skips non-floating tensors. BatchNorm's
``num_batches_tracked`` then becomes a float tensor; the model still trains, but its state dict changes dtype
and a float32 counter stops counting exactly past 2**24 batches.
"""

from __future__ import annotations

import torch

from lightning_optimizer.reference.precision import PrecisionPlugin
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class _CastEverything(PrecisionPlugin):
    def convert_module(self, module: torch.nn.Module) -> torch.nn.Module:
        with torch.no_grad():
            for tensor in [*module.parameters(), *module.buffers()]:
                tensor.data = tensor.data.to(self.param_dtype)
        return module


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        p = self.parts.precision
        self.parts.precision = _CastEverything(p.name, p.param_dtype, p.autocast_dtype, p.scales_loss)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
