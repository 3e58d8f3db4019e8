"""FAIL-002 broken: every ``step()`` that raises sets ``last_outcome`` to ``DISCARDED``.

The framework's wrapper catches whatever ``step()`` raises and records ``StepOutcome.DISCARDED`` before re-raising
("a failed call's outcome is DISCARDED", read from FAIL-003 alone). The window itself is left as the policy
leaves it, but a call refused for a bad argument, or one whose closure raised before any backward, now changes
``last_outcome``, which FAIL-002 says stays as before the call.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-002",
    [
        "test_a_call_that_fails_before_any_backward_changes_nothing[discard]",
        "test_a_call_that_fails_before_any_backward_changes_nothing[restore]",
    ],
    blind="contract 2026.12.6",
)


class _OutcomeOnRaise(WrappedOptimizer[Any]):
    @override
    def step(self, closure: Any = None, make_optimizer_step: Any = None, **kwargs: Any) -> Any:
        try:
            return super().step(closure, make_optimizer_step, **kwargs)
        except BaseException:
            self.training_context.windows[self.window_index].last_outcome = StepOutcome.DISCARDED
            raise


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(_OutcomeOnRaise, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
