"""CLIP-002 broken: after ``unscale_gradients()``, a ``backward()`` of another wrapper over other parameters is allowed.

The refusal exists so that scaled gradients are not added to a prepared window; an implementer reasons that a
wrapper whose parameters are disjoint from the prepared one cannot add anything to it, and checks only the calling
wrapper's own window. CLIP-002 refuses a backward of any wrapper of the context until the prepared window's closing
step (one rule for every wrapper, not the graph's).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CLIP-002", ["test_a_prepared_window_refuses_a_backward_over_other_parameters"], blind="batch 1")


class _OwnWindowRefusals(Refusals):
    caller: int | None = None

    @override
    def prepared_for_backward(self, context: TrainingContext) -> bool:
        call = context.windows.call
        if call is not None and call.prepared:
            return True
        if self.caller is None:
            return super().prepared_for_backward(context)
        return context.windows[self.caller].stage is WindowStage.PREPARED


class Context(MutantContext):
    def __init__(self, *args, **kwargs) -> None:  # type: ignore[no-untyped-def]
        super().__init__(*args, **kwargs)
        self.parts.refusals = _OwnWindowRefusals()

    @override
    def backward(self, wrapper: Any, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        refusals = self.parts.refusals
        if not isinstance(refusals, _OwnWindowRefusals):
            return super().backward(wrapper, loss, *args, **kwargs)
        refusals.caller = wrapper.window_index
        try:
            super().backward(wrapper, loss, *args, **kwargs)
        finally:
            refusals.caller = None


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
