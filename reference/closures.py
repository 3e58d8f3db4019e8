"""Closures handed to the inner optimizer: replayed on a real step, evaluated anew when the optimizer asks.

On a real step outside 16-mixed an inner optimizer whose ``step`` takes a closure gets one: its first call returns
the call's result (the closure ran, the window is prepared), each further call evaluates the closure anew, from
cleared gradients [CLOS-005]. An optimizer that evaluates the closure itself (LBFGS) has each evaluation start from
cleared gradients, toggled, reduced and clipped [CLOS-002, CLOS-004].
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from lightning_optimizer.reference.call import Call, CallStage

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext

__all__ = ["Closures"]

T = TypeVar("T")


class Closures:
    """What a real step hands the inner optimizer, and how the optimizer's own evaluations run."""

    def replay(
        self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T], result: T
    ) -> Callable[[], T]:
        """The closure a real step hands the inner optimizer [CLOS-005]."""
        calls = 0

        def evaluate() -> T:
            nonlocal calls
            calls += 1
            if calls == 1 or call.stage is not CallStage.STEPPING:
                return result
            return self.evaluate(context, call, index, closure)

        return evaluate

    def evaluate(self, context: TrainingContext, call: Call, index: int, closure: Callable[[], T]) -> T:
        """One evaluation by the inner optimizer: gradients cleared, toggled, reduced, clipped [CLOS-004]."""
        window = context.windows.all[index]
        call.advance(CallStage.REEVALUATING)
        window.clear_gradients()
        loss = context.run_closure(call, index, closure)
        if loss is None and window.evaluates_closure:
            name = type(window.optimizer).__name__
            raise TypeError(
                f"{name} evaluates the closure itself and needs the loss it returns, but the closure returned None: "
                "end the closure with `return loss` (after opt.backward(loss)); nothing was changed"
            )
        context.parts.preparation.prepare_evaluation(context, window)
        call.advance(CallStage.STEPPING)
        return loss
