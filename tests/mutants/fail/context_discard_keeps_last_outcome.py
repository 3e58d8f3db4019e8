"""FAIL-009 broken: ``context.discard(wrapper)`` empties the window but leaves the wrapper's ``last_outcome``.

The discard clears the window's gradients (those of parameters that left it too), drops its carried part and the
loss scaler's record, and resets its length, but does not report the window ``DISCARDED``: ``discard`` is the user's
own call, not a failed ``step()``, so the implementer leaves ``last_outcome`` to describe the last ``step()``
(``ACCUMULATED``, ``STEPPED``). A loop or framework that reads ``last_outcome`` to decide whether the window's
micro-steps still count (a logger of applied batches, a scheduler that waits for ``STEPPED``) is told they do.

Plausible: ``last_outcome`` is documented as what the last ``step()`` call did; FAIL-009's list ("``last_outcome``
``StepOutcome.DISCARDED``") is the one place that extends it to ``discard``.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.window import WindowStage
from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.wrapper import OptimizerWrapper
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant(
    "FAIL-009",
    [
        "test_discard_drops_the_window",
        "test_gradients_cleared_from_outside_are_refused",
        "test_parameters_changed_mid_window_are_refused[group appended to param_groups-step(closure)-discard()-1-held]",
        "test_parameters_changed_mid_window_are_refused[group appended to param_groups-step(closure)-discard()-2-held]",
    ],
    blind="batch 5",
)


class Context(MutantContext):
    @override
    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        window = self.parts.refusals.check_discard(self, wrapper)
        parts = self.parts
        for tensor in (*parts.parallel.window_tensors(window), *window.known):
            tensor.grad = None
        parts.scaling.forget(window.optimizer)
        parts.zeroing.drop(window)
        window.length = 0  # the defect: last_outcome left as the last step() set it
        if window.stage is not WindowStage.READY:
            window.move(WindowStage.READY)
        window.holding = []


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-009: discard() leaves the wrapper's last_outcome")
