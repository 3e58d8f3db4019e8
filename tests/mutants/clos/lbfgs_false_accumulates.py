"""CLOS-002 broken: LBFGS with ``make_optimizer_step=False`` is not refused when ``accumulate_grad_batches=1``.

Accumulation is refused where it is configured (``wrap`` with ``accumulate_grad_batches > 1``), but the step only
routes real steps to LBFGS: ``make_optimizer_step=False`` falls through to the first-order path, which runs the
closure once and accumulates its gradients as if LBFGS could take a window's mean.
"""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from lightning_optimizer.reference.refusals import Refusals
from lightning_optimizer.reference.window import Window
from lightning_optimizer.spec import ImplementationInfo
from mutants._base import MutantContext, mutant_info
from mutants._declared import Mutant

MUTANT = Mutant("CLOS-002", ["test_lbfgs_refuses_to_accumulate"])


class EvaluatorMayAccumulate(Refusals):
    @override
    def check_transition(self, window: Window, real: bool, closure: object) -> None:
        if window.evaluates_closure and not real:
            return  # falls through to the first-order path, which accumulates
        super().check_transition(window, real, closure)


class Context(MutantContext):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.parts.refusals = EvaluatorMayAccumulate()


def conformance_info() -> ImplementationInfo[Context]:
    return mutant_info(Context, __name__)
