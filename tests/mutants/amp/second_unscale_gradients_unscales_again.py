"""AMP-002 broken: a second ``unscale_gradients()`` before the closing step prepares (and unscales) the window again.

The implementer records that a window is prepared only inside the running ``step()``, so an explicit second call
prepares anew; torch's ``GradScaler.unscale_`` then refuses ("already called since the last update()"), and the
implementer "fixes" that by clearing the scaler's per-optimizer record before unscaling. One call, the common
case, is right; the second divides the gradients by the scale again (and re-runs the mean).
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer, torch_compat
from lightning_optimizer.reference.amp import GradScaling, optimizer_gradients
from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("AMP-002", ["test_a_second_unscale_gradients_prepares_nothing_again"], blind="batch 1")


class _ResettingScaling(GradScaling):
    @override
    def unscale(self, optimizer) -> None:  # type: ignore[no-untyped-def]
        if optimizer_gradients(optimizer) and torch_compat.has_unscaled(self.scaler, optimizer):
            torch_compat.forget_optimizer(self.scaler, optimizer)  # avoid unscale_'s "already called" error
        super().unscale(optimizer)


class Wrapper(WrappedOptimizer[Any]):
    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        window = context.windows[self.window_index]
        if window.stage is not WindowStage.PREPARED:
            super().unscale_gradients()  # not prepared, or prepared in the running step(): the reference's path
            return
        # The defect: only the running step() records a preparation, so a window prepared before it is prepared again.
        context.parts.refusals.check_unscale(window)
        if window.left is not None:
            context.parts.zeroing.take(window)
        context.parts.preparation.prepare(context, window)  # the window stays PREPARED


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        if isinstance(self.parts.scaling, GradScaling):
            self.parts.scaling = _ResettingScaling(self.parts.scaling.scaler)

    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(Wrapper, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
