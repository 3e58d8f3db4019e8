"""AMP-002 broken: a second ``unscale_gradients()`` before the closing step prepares (and unscales) the window again.

The implementer records that a window is prepared only inside the running ``step()``, so an explicit second call
prepares anew; torch's ``GradScaler.unscale_`` then refuses ("already called since the last update()"), and the
implementer "fixes" that by clearing the scaler's per-optimizer record before unscaling. One call, the common
case, is right; the second divides the gradients by the scale again (and re-runs the mean).
"""

from __future__ import annotations

from lightning_optimizer.reference import torch_compat
from lightning_optimizer.reference.amp import GradScaling, optimizer_gradients
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info


class _CallOnlyRefusals(Refusals):
    @staticmethod
    def prepared(context, window) -> bool:  # type: ignore[no-untyped-def]
        call = context._call
        return call is not None and call.window is window and call.prepared

    def check_zero_grad(self, context, window) -> None:  # type: ignore[no-untyped-def]
        if Refusals.prepared(context, window):
            raise RuntimeError("zero_grad() after unscale_gradients() before the closing step")


class _ResettingScaling(GradScaling):
    def unscale(self, optimizer) -> None:  # type: ignore[no-untyped-def]
        if optimizer_gradients(optimizer) and torch_compat.has_unscaled(self.scaler, optimizer):
            torch_compat.forget_optimizer(self.scaler, optimizer)  # avoid unscale_'s "already called" error
        super().unscale(optimizer)


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.refusals = _CallOnlyRefusals()
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = _ResettingScaling(self.parts.scaling.scaler)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
