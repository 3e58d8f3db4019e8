"""FAIL-007 broken: a window discarded by a failed ``unscale_gradients()`` is discarded silently, with no note.

The wrapper's ``unscale_gradients()`` prepares the window between calls itself and, when the preparation raises under
``on_failure="discard"``, discards the window completely (gradients, length, carried part, the loss scaler's record,
``last_outcome``) but lets the exception propagate as it came: without the note that names the optimizer, the
micro-steps lost and ``on_failure="restore"`` as the way to keep them. A user whose loop catches the error (an
out-of-memory retry) has no way to learn from the error that the window went.

Plausible: the note is FAIL-003's last sentence, written for a failed ``step()``; an implementer who writes the
between-calls discard by hand copies the state changes and leaves the message for later.
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
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-before-unscaling-window-of-1-discard-next-batch]"
    ],
    cells=F16,
    blind="batch 4",
)


class SilentDiscard(WrappedOptimizer[Any]):
    """``unscale_gradients()`` between calls, whose discard adds no note to the exception."""

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
        except BaseException:
            parts.scaling.forget(window.optimizer)
            for tensor in tensors:
                tensor.grad = None
            parts.zeroing.drop(window)
            parts.accumulation.discarded(window)
            raise  # the defect: no error.add_note(discard_note(window, ...))
        window.move(WindowStage.PREPARED)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(SilentDiscard, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a window discarded between calls gets no note")
