"""HOOK-003 broken: ``after_step`` also runs after a ``step()`` call that raises, with the outcome the call left.

The implementer calls the ``after_step`` hooks from a ``finally`` around the step so that a framework's bookkeeping
"always sees the call end", passing ``last_outcome`` (``DISCARDED`` after a discarded window, the previous outcome
under ``"restore"``). Successful calls are unaffected; a failed call now runs a hook the text says it runs none of,
and reports an outcome that is not the failed call's.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-003", ["test_a_call_that_raises_runs_no_after_step"], blind="batch 1")


class AfterStepInFinally(WrappedOptimizer[Any]):
    @override
    def step(self, closure: Any = None, make_optimizer_step: bool | None = None, **kwargs: Any) -> Any:
        try:
            return super().step(closure, make_optimizer_step, **kwargs)
        except BaseException:
            hooks = self.training_context.parts.hooks
            if hooks.after_step and self.last_outcome is not None:
                hooks.run_after_step(self, self.last_outcome)  # the defect: a failed call runs after_step
            raise


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(AfterStepInFinally, type(self.windows[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
