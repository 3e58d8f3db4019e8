"""FAIL-008 broken: a failed backward outside ``step()`` reports the calling wrapper's window as discarded, always.

Whatever the policy and whether or not autograd wrote anything, the wrapper's ``last_outcome`` reads
``StepOutcome.DISCARDED`` after its ``backward()`` raised. A loop that reads the outcome to count skipped batches
(or a framework that logs it) counts a window that is still there, and under ``"restore"`` one that was put back.

Plausible: "a failed call of its window" read as "a discarded call", the outcome set where the exception is caught.
"""

from __future__ import annotations

from typing import Any

import torch
from typing_extensions import override

from lightning_optimizer.reference.wrapper import WrappedOptimizer
from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-008",
    [
        "test_a_failed_backward_outside_step_follows_the_policy[fails-before-writing-a+b-2-held-discard]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-before-writing-a+b-2-held-restore]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-before-writing-a-1-held-discard]",
        "test_a_failed_backward_outside_step_follows_the_policy[fails-before-writing-a-1-held-restore]",
    ],
)


class Context(MutantContext):
    @override
    def backward(self, wrapper: WrappedOptimizer[Any], loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        try:
            super().backward(wrapper, loss, *args, **kwargs)
        except BaseException:
            if self.windows.call is None:
                self.windows.all[wrapper.window_index].last_outcome = StepOutcome.DISCARDED  # the defect
            raise


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-008: a failed backward outside step() is reported as discarded")
