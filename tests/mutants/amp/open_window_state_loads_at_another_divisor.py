"""AMP-007 broken for checkpoints: a 16-mixed state with a window open loads into a context of another
``accumulate_grad_batches``.

Its gradients carry the loss divisor of the run that saved it; the resumed window mixes them with micro-steps
divided otherwise, and its real step applies neither run's mean.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("AMP-007", ["test_open_window_state_of_another_divisor_is_refused"], cells=F16)


class _DivisorUnchecked(StateFormat):
    @override
    def check(self, context: TrainingContext, state: object) -> list[dict[str, Any]]:
        if isinstance(state, dict) and "window_divisor" in state:
            state = {**state, "window_divisor": context.parts.scaling.window_divisor(context.accumulate_grad_batches)}
        return super().check(context, state)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = _DivisorUnchecked()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
