"""HOOK-002 broken: for an optimizer that evaluates its closure (LBFGS), ``before_optimizer_step`` runs per evaluation.

HOOK-002 says the hook runs "after the window's preparation and before the inner step"; for LBFGS each evaluation's
gradients are prepared (reduced, clipped) on their own, so the implementer moves the hook to after each
evaluation's preparation, where "the gradients it sees are those the step applies". A one-iteration LBFGS still
calls it once; a usual LBFGS step calls it as often as it evaluates the closure.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from typing_extensions import override

from lightning_optimizer.reference.closures import Closures
from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "HOOK-002",
    [
        "test_hooks_of_an_evaluating_optimizer_run_once_per_real_step[class attribute]",
        "test_hooks_of_an_evaluating_optimizer_run_once_per_real_step[instance attribute]",
    ],
    blind="batch 1",
)

T = TypeVar("T")


class PerEvaluationHooks(Hooks):
    """Defers an evaluating optimizer's ``before_optimizer_step`` to its evaluations."""

    def __init__(self) -> None:
        super().__init__()
        self.pending_wrapper: Any = None

    @override
    def run_before_optimizer_step(self, wrapper: Any, *, evaluation: bool = False) -> None:
        window = wrapper.training_context.windows[wrapper.window_index]
        if window.evaluates_closure and not evaluation:
            self.pending_wrapper = wrapper  # run after each evaluation's preparation instead
            return
        super().run_before_optimizer_step(wrapper)


class HookedClosures(Closures):
    @override
    def evaluate(self, context: Any, call: Any, index: int, closure: Callable[[], T]) -> T:
        loss = super().evaluate(context, call, index, closure)
        hooks = context.parts.hooks
        wrapper = getattr(hooks, "pending_wrapper", None)
        if wrapper is not None and wrapper.window_index == index:
            hooks.run_before_optimizer_step(hooks.pending_wrapper, evaluation=True)
        return loss


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.hooks = PerEvaluationHooks()
        self.parts.closures = HookedClosures()

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self.parts.hooks = PerEvaluationHooks()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
