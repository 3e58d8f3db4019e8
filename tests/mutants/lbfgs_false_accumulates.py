"""CLOS-002 broken: LBFGS with ``make_optimizer_step=False`` is not refused when ``accumulate_grad_batches=1``.

Accumulation is refused where it is configured (``wrap`` with ``accumulate_grad_batches > 1``), but the step only
routes real steps to LBFGS: ``make_optimizer_step=False`` falls through to the first-order path, which runs the
closure once and accumulates its gradients as if LBFGS could take a window's mean.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from lightning_optimizer.spec import ImplementationInfo, StepOutcome
from mutants._base import MutantContext, mutant_info

T = TypeVar("T")


class Context(MutantContext):
    def _step(
        self, index: int, closure: Callable[[], T] | None, make_optimizer_step: bool | None, kwargs: dict[str, Any]
    ) -> T | None:
        slot = self._slots[index]
        if not slot.evaluates_closure or make_optimizer_step is not False:
            return super()._step(index, closure, make_optimizer_step, kwargs)
        self._check_step_arguments(closure, make_optimizer_step)
        result = None if closure is None else self._run_closure_keeping_window(index, closure, False)
        slot.pending += 1
        slot.last_outcome = StepOutcome.ACCUMULATED
        return result


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
