"""FAIL-003 broken: a window discarded because its inner step raised keeps the outcome of the call before.

The framework records ``DISCARDED`` in the handler around the user's closure, where it expected failures. An
exception from the inner optimizer's step takes another path: the window is discarded there too (gradients
``None``, length 0, the scaler's record reset), but ``last_outcome`` still reads what the previous call left, so
after a window of one micro-step it reads ``STEPPED`` for a step that was never taken.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.accumulation import Accumulation
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-003",
    [
        "test_failed_inner_step_leaves_the_window[discard-window-1-closure]",
        "test_failed_inner_step_leaves_the_window[discard-window-3-closure-clipped]",
        "test_failed_inner_step_leaves_the_window[discard-cut-short-backward-adam]",
        "test_failed_inner_step_leaves_the_window[discard-prepared-backward-clipped]",
        "test_failed_inner_step_leaves_the_window[discard-retried-in-next-batch]",
        "test_a_discarded_window_is_gone_and_the_next_is_exact[inner-step-outside-batch-skipped]",
    ],
)


class OutcomeOfTheClosureOnly(Accumulation):
    def __init__(self, every: object) -> None:
        super().__init__(every)
        self.inner_step_failed: set[int] = set()

    @override
    def discarded(self, window: Window) -> None:
        outcome = window.last_outcome
        super().discarded(window)
        if id(window) in self.inner_step_failed:
            self.inner_step_failed.discard(id(window))
            window.last_outcome = outcome  # the inner step's path never records DISCARDED


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.accumulation = OutcomeOfTheClosureOnly(self.parts.accumulation.accumulate_grad_batches)

    @override
    def inner_step(self, window: Window, kwargs: dict[str, Any], closure: Callable[[], Any] | None = None) -> Any:
        try:
            return super().inner_step(window, kwargs, closure)
        except BaseException:
            accumulation = self.parts.accumulation
            if isinstance(accumulation, OutcomeOfTheClosureOnly):
                accumulation.inner_step_failed.add(id(window))
            raise


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
