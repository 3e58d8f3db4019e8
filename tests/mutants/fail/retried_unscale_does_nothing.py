"""FAIL-007 broken: after a failed ``unscale_gradients()``, calling it again does nothing.

CLIP-002 says a second ``unscale_gradients()`` before the closing step does nothing. This wrapper implements that
with a mark set when the call begins (per window, until its next real step or micro-step), not when the preparation
succeeds: after a failure that the policy put right (the window restored, FAIL-004), the retry returns at once. The
user who retried so as to inspect or clip the gradients by hand (the reason ``unscale_gradients()`` exists) gets them
unprepared: still scaled under 16-mixed, not yet the mean. The closing ``step()`` prepares the window itself (it is
not marked prepared), so the retry's only visible trace is in what the user saw and did between the two calls.

Plausible: "called already" is the cheapest guard to write, and it is right whenever the first call succeeded.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info, wrapper_subclass
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-007",
    [
        "test_a_failed_unscale_gradients_follows_the_policy[1-group-no-clip-fails-before-unscaling-window-of-1-restore-unscale-again]"
    ],
    cells=F16,
    blind="batch 4",
)

_CALLED: weakref.WeakKeyDictionary[torch.optim.Optimizer, tuple[int, int, object]] = weakref.WeakKeyDictionary()
"""The window position (real steps, micro-steps, outcome) at which ``unscale_gradients()`` was last called."""


class UnscaleOncePerWindow(WrappedOptimizer[Any]):
    """``unscale_gradients()`` that does nothing when it was called already in this window, whatever came of it."""

    @override
    def unscale_gradients(self) -> None:
        context = self.training_context
        window = context.windows.all[self.window_index]
        if context.windows.call is None:  # between calls: the once-per-window guard
            mark = (window.steps, window.length, window.last_outcome)
            if _CALLED.get(window.optimizer) == mark:
                return  # the defect: "called already" is not "prepared already"
            _CALLED[window.optimizer] = mark
        super().unscale_gradients()


class Context(MutantContext):
    @override
    def new_wrapper(self, index: int) -> WrappedOptimizer[Any]:
        return wrapper_subclass(UnscaleOncePerWindow, type(self.windows.all[index].optimizer))(self, index)


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-007: unscale_gradients() retried after a failure does nothing")
