"""FAIL-007 broken: a failed ``unscale_gradients()`` under "restore" puts back the gradients, not the scaler's record.

Under ``on_failure="restore"`` the wrapper's ``unscale_gradients()`` copies the window's gradients before preparing
it between calls and, when the preparation raises, puts them (and the carried part) back: the window looks exactly
as before. The loss scaler's record is left as the failed preparation made it: when clipping raised after
``GradScaler.unscale_``, the scaler says the optimizer was unscaled in this iteration. The retry
(``unscale_gradients()`` again, then the closing ``step()``) therefore never unscales the restored, still scaled
gradients, and the step applies them multiplied by the loss scale.

Plausible: "restore" is read as "restore the tensors", the scaler being torch's object that the implementer does not
think of as part of the window; the spec's "the loss scaler's record as it was" is the easy item to miss.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-007",
    [
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-after-unscaling-window-of-1-restore-step]"
    ],
    cells=F16,
    blind="batch 4",
)


class UnscaleRestoresTensorsOnly(WrappedOptimizer[Any]):
    """``unscale_gradients()`` between calls, whose restore leaves the scaler's record of the failed unscaling."""

    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        windows, parts = context.windows, context.parts
        window = windows.all[self.window_index]
        if windows.call is not None or windows.prepared(window) or context.on_failure != "restore":
            super().unscale_gradients()
            return
        parts.refusals.check_unscale(window)
        taking = None if window.left is None else parts.zeroing.take(window)
        changes = parts.preparation.changes(context, window)
        transaction = parts.failure.begin_preparation(parts.parallel.window_tensors(window), changes=changes)
        try:
            parts.preparation.prepare(context, window)
        except BaseException:
            transaction.fail()  # the gradients as they were
            if taking is not None:
                parts.zeroing.untake(window, taking)
            raise  # the defect: parts.scaling.forget(window.optimizer) is never called
        transaction.commit()
        window.move(WindowStage.PREPARED)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(UnscaleRestoresTensorsOnly, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a restored unscale_gradients() keeps the loss scaler's record")
