"""CKPT-003 broken: the context's ``load_state_dict`` checks the number of optimizers but not the shapes.

A state with the same optimizers over differently shaped parameters loads part of its gradients, then fails
with torch's ``RuntimeError``. The check only tries a state with another number of optimizers (``UNCAUGHT`` in
``tests/test_mutants.py``).
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


MUTANT = Mutant("CKPT-003", ["test_context_state_for_another_layout_is_refused"])


class CountOnlyFormat(StateFormat):
    @override
    def check(self, context: TrainingContext, state: object) -> list[dict[str, Any]]:
        wrapped = len(context.windows)
        if not isinstance(state, dict) or len(state.get("optimizers", ())) != wrapped:
            raise ValueError(f"the state does not hold {wrapped} optimizers")
        entries: list[dict[str, Any]] = state["optimizers"]
        return entries


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = CountOnlyFormat()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
