"""FAIL-009 broken: ``context.discard(wrapper)`` clears the gradients of the optimizer's parameters as they are now.

The discard clears ``p.grad`` for every parameter in the inner optimizer's ``param_groups`` at the time of the call,
the way ``optimizer.zero_grad(set_to_none=True)`` would. A parameter popped from a group while the window was open
(the change WIN-001 refuses and tells the user to recover from with ``discard``) keeps the gradient it accumulated in
the dropped window: put back into the optimizer later, or stepped by another one, it carries micro-steps that were
discarded.

Plausible: "every gradient of its parameters" reads as the optimizer's parameters; the parenthesis "(and of
parameters that left the optimizer while the window was open)" is what asks for the window's own record of them.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.wrapper import OptimizerWrapper
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-009",
    [
        "test_parameters_changed_mid_window_are_refused[parameter popped from a group-step()-discard()-1-held]",
        "test_parameters_changed_mid_window_are_refused[parameter popped from a group-step()-discard()-2-held]",
    ],
    blind="batch 5",
)


class Context(MutantContext):
    @override
    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        window = self.parts.refusals.check_discard(self, wrapper)
        parts = self.parts
        for tensor in parts.parallel.window_tensors(window):  # the defect: not the window's removed parameters
            tensor.grad = None
        parts.scaling.forget(window.optimizer)
        parts.zeroing.drop(window)
        parts.accumulation.discarded(window)
        window.holding = []


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-009: discard() leaves the gradients of parameters removed mid-window")
