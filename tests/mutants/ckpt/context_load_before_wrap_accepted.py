"""CKPT-002 broken: a context state loaded before all of its optimizers are wrapped is accepted.

``load_state_dict`` loads the entries of the optimizers wrapped so far, in order, and ignores the rest (with none
wrapped, only the loss scaler's state), as a framework that restores each registered object's saved state by
position and skips the entries it has nothing registered for yet. A restore that runs before the optimizers are
built then loses the open windows it was meant to carry, silently; with some of them wrapped, those take their
entries and the others' are dropped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from typing_extensions import override

from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

if TYPE_CHECKING:
    from lightning_optimizer.reference.context import TrainingContext


MUTANT = Mutant("CKPT-002", ["test_state_loaded_before_its_optimizers_are_wrapped_is_refused"])


class ByPositionFormat(StateFormat):
    @override
    def check(self, context: TrainingContext, state: object) -> list[dict[str, Any]]:
        entries = state.get("optimizers") if isinstance(state, dict) else None
        wrapped = len(context.windows)
        if isinstance(state, dict) and isinstance(entries, list) and len(entries) > wrapped:
            return super().check(context, {**state, "optimizers": entries[:wrapped]})
        return super().check(context, state)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = ByPositionFormat()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
