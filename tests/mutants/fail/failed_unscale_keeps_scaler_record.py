"""FAIL-007 broken: a failed ``unscale_gradients()`` under "discard" drops the window but not the loss scaler's record.

The wrapper's ``unscale_gradients()`` prepares the window between calls itself and, when the preparation raises
under ``on_failure="discard"``, does what FAIL-003 lists for a window: gradients ``None``, length 0,
``last_outcome`` DISCARDED, the note. It forgets the one item that is not the window's own: the loss scaler's record
of the optimizer in this iteration. When clipping fails after ``GradScaler.unscale_`` ran, the scaler still says the
optimizer was unscaled, so the next window of the same iteration is never unscaled and its real step applies
gradients still multiplied by the loss scale.

Plausible: FAIL-003 reads as a list of what happens to "the window", and an implementer who writes the discard in
the wrapper clears exactly that list; inside ``step()`` the reference's shared transaction drops the scaler's record
for them, so the omission only shows for the new between-calls path.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.failure import discard_note
from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-007",
    [
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-after-unscaling-window-of-1-discard-new-window-now]"
    ],
    cells=F16,
    blind="batch 4",
)


class UnscaleKeepsScalerRecord(WrappedOptimizer[Any]):
    """``unscale_gradients()`` between calls, whose discard leaves the scaler's record of the optimizer."""

    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        windows, parts = context.windows, context.parts
        window = windows.all[self.window_index]
        if windows.call is not None or windows.prepared(window) or context.on_failure != "discard":
            super().unscale_gradients()
            return
        parts.refusals.check_unscale(window)
        if window.left is not None:
            parts.zeroing.take(window)
        tensors = parts.parallel.window_tensors(window)
        try:
            parts.preparation.prepare(context, window)
        except BaseException as error:
            for tensor in tensors:
                tensor.grad = None
            error.add_note(discard_note(window, carried=bool(window.carried)))
            parts.zeroing.drop(window)
            parts.accumulation.discarded(window)
            raise  # the defect: parts.scaling.forget(window.optimizer) is never called
        window.move(WindowStage.PREPARED)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(UnscaleKeepsScalerRecord, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a discarded unscale_gradients() keeps the loss scaler's record")
