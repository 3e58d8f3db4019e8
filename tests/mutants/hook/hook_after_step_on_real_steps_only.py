"""HOOK-003 broken: ``after_step`` runs after real steps only, not after a call that accumulated.

As a framework that counts only optimizer steps: a loop that reads every call's outcome from the hook (to count
micro-steps, or to log each one) never hears of the accumulating ones.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.spec import ImplementationInfo, OptimizerWrapper, StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-003", ["test_hooks_follow_every_backward_and_step"])


class AfterRealStepsOnly(Hooks):
    @override
    def run_after_step(self, wrapper: OptimizerWrapper[Any], outcome: StepOutcome) -> None:
        if outcome is not StepOutcome.ACCUMULATED:
            super().run_after_step(wrapper, outcome)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.hooks = AfterRealStepsOnly()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.parts.hooks = AfterRealStepsOnly()  # a copy carries no hooks, and runs them as this one does


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
