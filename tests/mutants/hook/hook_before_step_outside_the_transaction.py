"""HOOK-004 broken: ``before_optimizer_step`` runs after the inner step, outside the call's transaction.

The hook still sees the gradients the step applied, but one that raises leaves the step taken: parameters moved,
the window closed, while the call raised.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.hooks import Hooks
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo, OptimizerWrapper
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("HOOK-004", ["test_a_raising_hook_fails_the_call_as_a_raising_closure_does"])


class AfterTheInnerStep(Hooks):
    def __init__(self) -> None:
        super().__init__()
        self.deferred: OptimizerWrapper[Any] | None = None

    @override
    def run_before_optimizer_step(self, wrapper: OptimizerWrapper[Any]) -> None:
        self.deferred = wrapper  # run once the inner step returned

    def run_deferred(self) -> None:
        wrapper, self.deferred = self.deferred, None
        if wrapper is not None:
            super().run_before_optimizer_step(wrapper)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._hooks_after = AfterTheInnerStep()
        self.parts.hooks = self._hooks_after

    @override
    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._hooks_after = AfterTheInnerStep()  # a copy carries no hooks, and runs them as this one does
        self.parts.hooks = self._hooks_after

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        result = super().inner_step(window, kwargs, closure)
        # The step is taken: nothing of this call is undone now. (Nothing reads the running call between the inner
        # step's return and the call's end, which clears it again.)
        self.windows.end_call()
        self._hooks_after.run_deferred()
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
