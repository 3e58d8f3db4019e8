"""CLIP-002 broken: a backward in the inner optimizer's re-evaluation of a prepared window is refused.

The implementer keeps CLIP-002's rule "no backward between the window's preparation and its closing step" as one
flag that holds until the inner step returns, forgetting the exception for evaluations the closing step's inner
optimizer makes itself. A two-pass (SAM-style) optimizer whose closure calls ``w.backward`` then fails its second
pass with ``RuntimeError``; LBFGS (never prepared as a window) and closures using ``loss.backward()`` still work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.call import CallStage
from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CLIP-002", ["test_reevaluations_run_in_the_autocast_region_and_may_backward"], blind="batch 1")


class StickyPreparedRefusals(Refusals):
    @override
    def prepared_for_backward(self, context: TrainingContext) -> bool:
        call = context.windows.call
        if call is not None and call.stage is CallStage.REEVALUATING and not call.window.evaluates_closure:
            return True  # the defect: the window was prepared in this call, so any backward is refused
        return super().prepared_for_backward(context)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = StickyPreparedRefusals()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
