"""FAIL-009 broken: ``context.discard(wrapper)`` does not make the loss scaler forget the optimizer's iteration.

The discard drops the window's gradients, carried part, length and outcome, but leaves ``torch.amp.GradScaler``'s
per-optimizer record: after ``unscale_gradients()`` prepared the window, the scaler still holds the optimizer as
unscaled (and its found-inf) for this iteration. The next window in the same iteration is then taken for one
unscaled already: its real step applies gradients still multiplied by the loss scale (or, where ``unscale_`` is
called unconditionally, torch raises ``unscale_() has already been called on this optimizer``), or is skipped for the
dropped window's found-inf.

Plausible: the loss scaler is a separate object whose record a user never sees; a discard written as "clear the
gradients and reset the counters" forgets it, and FAIL-003's list has it in the middle.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.spec import ImplementationInfo
from lightning_optimizer.spec.wrapper import OptimizerWrapper
from mutants._base import MutantContext, mutant_info
from mutants._declared import F16, Mutant

MUTANT = Mutant(
    "FAIL-009",
    [
        "test_discard_drops_the_window[empty-prepared-by-unscale]",
    ],
    cells=F16,
    blind="batch 5",
)


class Context(MutantContext):
    @override
    def discard(self, wrapper: OptimizerWrapper[Any]) -> None:
        window = self.parts.refusals.check_discard(self, wrapper)
        parts = self.parts
        for tensor in (*parts.parallel.window_tensors(window), *window.known):
            tensor.grad = None
        # the defect: no parts.scaling.forget(window.optimizer)
        parts.zeroing.drop(window)
        parts.accumulation.discarded(window)
        window.holding = []


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, "FAIL-009: discard() keeps the loss scaler's record of the optimizer")
