"""ZERO-007 broken: ``load_state_dict`` accepts a state saved under the other ``zero_grad_after_step``.

A state of the clearing setting loads into a leaving context (and the other way round) as if it were its own.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.context import TrainingContext
from lightning_optimizer.reference.state import StateFormat
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("ZERO-007", ["test_a_state_of_the_other_setting_is_refused"])


class AcceptsOtherSetting(StateFormat):
    @override
    def check(self, context: TrainingContext, state: object) -> list[dict[str, Any]]:
        if isinstance(state, dict):
            state = {**state, "zero_grad_after_step": context.zero_grad_after_step}
        return super().check(context, state)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.state = AcceptsOtherSetting()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
