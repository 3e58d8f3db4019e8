"""FAIL-007 broken: a window discarded by a failed ``unscale_gradients()`` keeps the gradients it carried.

With ``zero_grad_after_step=False`` a window carries what the last real step left (ZERO-005), set aside until its
preparation adds it to the window's mean. The wrapper's ``unscale_gradients()`` discards a failed window between calls
by clearing the parameters' gradients, the length, the outcome and the scaler's record, with the note (which even says
the carried gradients went), but it does not drop the carried part itself: the next window's real step adds the
discarded window's carried gradients to its own mean.

Plausible: the carried part lives beside the gradients, not on the parameters; "every gradient the window holds is
``None``" is done by clearing ``param.grad``, and ZERO-007's "clears it with the window" is in another section.
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
        "test_a_failed_unscale_gradients_of_a_carrying_window[fails-before-unscaling-discard]",
        "test_a_failed_unscale_gradients_of_a_carrying_window[fails-after-unscaling-discard]",
    ],
    cells=F16,
    blind="batch 4",
)


class DiscardKeepsCarried(WrappedOptimizer[Any]):
    """``unscale_gradients()`` between calls, whose discard leaves the carried part of the window."""

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
            parts.scaling.forget(window.optimizer)
            for tensor in tensors:
                tensor.grad = None
            error.add_note(discard_note(window, carried=bool(window.carried)))
            parts.accumulation.discarded(window)
            raise  # the defect: parts.zeroing.drop(window) is never called
        window.move(WindowStage.PREPARED)


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(DiscardKeepsCarried, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: a window discarded between calls keeps its carried part")
