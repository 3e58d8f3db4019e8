"""FAIL-007 broken: a failed ``unscale_gradients()`` under "restore" puts the gradients back but leaves the window
marked prepared.

The wrapper's ``unscale_gradients()`` marks the window prepared before it prepares it (so that a second call does
nothing, CLIP-002) and, when the preparation raises under ``on_failure="restore"``, restores the gradients, the
carried part and the loss scaler's record, but not the mark. The window is "exactly as before" in every tensor, yet
the closing ``step()`` (or a second ``unscale_gradients()``) takes it for prepared and prepares nothing: the real step
applies the window's raw sum (not its mean, not unscaled, not clipped), and a ``backward()`` or ``zero_grad()`` in
between is refused.

Plausible: setting the flag first is the usual guard against doing the work twice; FAIL-004 lists "preparation" among
what is restored, but the restore is written around the tensors.
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
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-before-unscaling-window-of-1-restore-step]"
    ],
    cells=F16,
    blind="batch 4",
)


class MarkedBeforePreparing(WrappedOptimizer[Any]):
    """``unscale_gradients()`` between calls that marks the window prepared first and keeps the mark on failure."""

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
        window.move(WindowStage.PREPARED)  # prepared once: a second call does nothing
        try:
            parts.preparation.prepare(context, window)
        except BaseException:
            parts.scaling.forget(window.optimizer)
            transaction.fail()
            if taking is not None:
                parts.zeroing.untake(window, taking)
            raise  # the defect: the window stays PREPARED
        transaction.commit()


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(MarkedBeforePreparing, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a restored unscale_gradients() leaves the window marked prepared")
